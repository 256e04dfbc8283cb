"""Durable tasks on one throw-away Redis: replaystore against FastMCP + ``fastmcp-tasks``.

Both run as real HTTP server processes on the same Redis, two replicas each:
replaystore's ``example-server`` (its ``countdown`` and ``ask`` tools are tasks)
and a FastMCP server with ``fastmcp-tasks``' ``TasksExtension``
(``fastmcp_tasks_peer.py``), which pins another FastMCP and so runs from its
own virtual environment (``--peer-python``, default ``/tmp/ft/bin/python``);
without one, only replaystore is measured. Every figure is measured in one run;
absolute numbers are indicative only on a shared machine.

    python -m benchmarks.tasks [--quick] [--json PATH] [--peer-python PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

from replaystore import ReplayBuffer
from replaystore.backends.coordination import coordination_of
from replaystore.tasks import task_store_for
from replaystore.testing.servers import find_free_port

from .common import commandstats, redis_server

EXTENSION = "io.modelcontextprotocol/tasks"
PEER_SCRIPT = Path(__file__).with_name("fastmcp_tasks_peer.py")
DEFAULT_PEER_PYTHON = "/tmp/ft/bin/python"
LEASE_SECONDS = 2.0
PEER_KILL_WINDOW = 30.0
TERMINAL = ("completed", "failed", "cancelled")
_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "benchmarks", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
}
_ids = itertools.count(1)


class Replica:
    """One server process on loopback (started, waited for, always stopped)."""

    def __init__(self, args: list[str], port: int, log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server on {self.port} not ready") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def replaystore_replica(url: str, logs: Path, name: str) -> Replica:
    port = find_free_port()
    args = [
        sys.executable, "-m", "replaystore", "example-server", "--host", "127.0.0.1",
        "--port", str(port), "--url", f"{url}?prefix=bt:", "--log-level", "error",
        "--lease-seconds", str(LEASE_SECONDS),
    ]  # fmt: skip
    return Replica(args, port, logs / f"{name}.log")


def peer_replica(python: str, url: str, logs: Path, name: str) -> Replica:
    port = find_free_port()
    return Replica([python, str(PEER_SCRIPT), str(port), url], port, logs / f"{name}.log")


async def send(http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any]) -> Any:
    """One 2026-07-28 JSON-RPC request declaring the tasks extension; the response message."""
    name = str(params.get("name") or params.get("taskId") or "")
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
        "Mcp-Name": name,
    }
    body = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {**params, "_meta": _META},
    }
    response = await http.post(url, json=body, headers=headers)
    return response.json()


async def create(http: httpx.AsyncClient, url: str, tool: str, args: dict[str, Any]) -> str:
    reply = await send(http, url, "tools/call", {"name": tool, "arguments": args})
    task_id: str = reply["result"]["taskId"]
    return task_id


async def get(http: httpx.AsyncClient, url: str, task_id: str) -> dict[str, Any] | None:
    reply = await send(http, url, "tasks/get", {"taskId": task_id})
    result: dict[str, Any] | None = reply.get("result")
    return result


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(http: httpx.AsyncClient, urls: list[str], count: int) -> dict[str, Any]:
    """``tools/call`` to a ``tasks/get`` on the other replica that resolves the task (ms)."""
    samples: list[float] = []
    for i in range(count):
        here, there = urls[i % len(urls)], urls[(i + 1) % len(urls)]
        start = time.perf_counter()
        task_id = await create(http, here, "countdown", {"n": 0})
        while await get(http, there, task_id) is None:
            pass
        samples.append((time.perf_counter() - start) * 1000)
    return {
        "tasks": count,
        "p50_ms": round(percentile(samples, 0.50), 2),
        "p99_ms": round(percentile(samples, 0.99), 2),
    }


async def gets_per_second(http: httpx.AsyncClient, url: str, count: int) -> dict[str, Any]:
    """``tasks/get`` of one finished task from 8 concurrent callers on one replica."""
    task_id = await create(http, url, "countdown", {"n": 0})
    for _ in range(200):
        task = await get(http, url, task_id)
        if task is not None and task["status"] in TERMINAL:
            break
        await asyncio.sleep(0.05)

    async def worker(n: int) -> None:
        for _ in range(n):
            assert await get(http, url, task_id) is not None

    start = time.perf_counter()
    await asyncio.gather(*(worker(count // 8) for _ in range(8)))
    elapsed = time.perf_counter() - start
    return {"gets": count // 8 * 8, "per_second": round(count // 8 * 8 / elapsed, 1)}


async def redis_cost(
    r: aioredis.Redis, run: Callable[[], Awaitable[None]], lives: int
) -> dict[str, Any]:
    """Redis CPU (``used_cpu_sys + used_cpu_user``) and commandstats per task life."""
    await r.config_resetstat()
    before = await r.info("cpu")
    start = time.perf_counter()
    for _ in range(lives):
        await run()
    elapsed = time.perf_counter() - start
    after = await r.info("cpu")
    stats = await commandstats(r)
    for noise in ("config|resetstat", "info"):
        stats.pop(noise, None)
    cpu = sum(float(after[k]) - float(before[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    calls = sum(c for c, _ in stats.values())
    usec = sum(u for _, u in stats.values())
    top = sorted(stats.items(), key=lambda kv: -kv[1][0])[:6]
    return {
        "lives": lives,
        "seconds": round(elapsed, 2),
        "cpu_us_per_life": round(cpu * 1e6 / lives, 1),
        "commands_per_life": round(calls / lives, 1),
        "commandstats_us_per_life": round(usec / lives, 1),
        "top_commands": {k: round(c / lives, 1) for k, (c, _) in top},
    }


async def idle_cpu(r: aioredis.Redis, seconds: float) -> float:
    """Redis CPU per second (us) with the replicas up and no client: their background work."""
    before = await r.info("cpu")
    await asyncio.sleep(seconds)
    after = await r.info("cpu")
    cpu = sum(float(after[k]) - float(before[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    return round(cpu * 1e6 / seconds, 1)


async def http_life(http: httpx.AsyncClient, urls: list[str], polls: int) -> None:
    """Create on one replica, then ``polls`` gets on the other (the task ends meanwhile)."""
    task_id = await create(http, urls[0], "countdown", {"n": 0})
    for _ in range(polls):
        await get(http, urls[1], task_id)


async def store_life(redis_url: str, lives: int, r: aioredis.Redis) -> dict[str, Any]:
    """replaystore's task store alone: create, 10 status changes, result, 20 polls."""
    buffer = ReplayBuffer.from_url(f"{redis_url}?prefix=bs:")
    store = task_store_for(coordination_of(buffer.backend))

    async def life() -> None:
        task_id = uuid.uuid4().hex
        await store.create(task_id, runner="r", lease=30.0, ttl_ms=60_000)
        for _ in range(5):  # working -> input_required -> working, five times
            (key,) = await store.ask(task_id, "r", [{"method": "elicitation/create"}]) or [""]
            await store.respond(task_id, {key: {"action": "accept"}})
        await store.finish(task_id, "completed", result={"content": []})
        for _ in range(20):
            await store.get(task_id)

    try:
        await life()  # warm-up: scripts loaded
        return await redis_cost(r, life, lives)
    finally:
        await store.aclose()
        await buffer.aclose()


async def kill_to_failed(
    http: httpx.AsyncClient,
    doomed: Replica,
    survivor_url: Callable[[], str],
    tool: str,
    window: float,
) -> dict[str, Any]:
    """SIGKILL the runner of a task, then poll a survivor until the task ends or ``window``.

    ``survivor_url`` is called once the task runs on ``doomed``, so a survivor
    started only then cannot have picked the task up itself.
    """
    args = {"n": 100_000, "interval_ms": 10} if tool == "countdown" else {}
    task_id = await create(http, doomed.url, tool, args)
    await asyncio.sleep(1.0)  # running (and for ``ask``, waiting for input) on the runner
    survivor = await asyncio.to_thread(survivor_url)
    before = await get(http, survivor, task_id)
    doomed.proc.send_signal(signal.SIGKILL)
    doomed.proc.wait(10)
    killed = time.monotonic()
    status = before["status"] if before else None
    while time.monotonic() - killed < window:
        task = await get(http, survivor, task_id)
        status = task["status"] if task else None
        if status in TERMINAL:
            break
        await asyncio.sleep(0.05)
    seconds = time.monotonic() - killed
    return {
        "status_before_kill": before["status"] if before else None,
        "status": status,
        "seconds": round(seconds, 2),
        "window_s": window,
    }


async def measure(
    name: str, urls: list[str], r: aioredis.Redis, sizes: dict[str, int]
) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as http:
        await latency(http, urls, 5)  # warm-up
        out: dict[str, Any] = {"idle_cpu_us_per_s": await idle_cpu(r, sizes["idle_s"])}
        out["latency"] = await latency(http, urls, sizes["latency"])
        out["gets"] = [await gets_per_second(http, u, sizes["gets"]) for u in urls]
        out["http_life"] = await redis_cost(r, lambda: http_life(http, urls, 20), sizes["lives"])
    print(f"  {name}: done", file=sys.stderr)
    return out


async def run(quick: bool, peer_python: str | None) -> dict[str, Any]:
    sizes = (
        {"latency": 20, "gets": 160, "lives": 10, "store_lives": 20, "idle_s": 1}
        if quick
        else {"latency": 300, "gets": 2000, "lives": 200, "store_lives": 1000, "idle_s": 5}
    )
    logs = Path(tempfile.mkdtemp(prefix="replaystore-tasks-bench-"))
    results: dict[str, Any] = {"meta": {"quick": quick, "sizes": sizes, "lease_s": LEASE_SECONDS}}
    with redis_server() as server:
        r = aioredis.Redis.from_url(server.url)
        results["meta"]["redis_server"] = (await r.info("server"))["redis_version"]
        results["replaystore_store_life"] = await store_life(server.url, sizes["store_lives"], r)
        ours = [replaystore_replica(server.url, logs, f"rs-{i}") for i in range(2)]
        try:
            for rep in ours:
                rep.wait_ready()
            urls = [rep.url for rep in ours]
            results["replaystore"] = await measure("replaystore", urls, r, sizes)
            async with httpx.AsyncClient(timeout=30) as http:
                results["replaystore"]["kill"] = await kill_to_failed(
                    http, ours[0], lambda: ours[1].url, "ask", LEASE_SECONDS + 5
                )
        finally:
            for rep in ours:
                rep.stop()
        if peer_python is None:
            results["peer"] = None
        else:
            results["peer"] = await run_peer(peer_python, server.url, logs, r, sizes)
        await r.aclose()
    return results


async def run_peer(
    python: str, url: str, logs: Path, r: aioredis.Redis, sizes: dict[str, int]
) -> dict[str, Any]:
    peers = [peer_replica(python, f"{url}/1", logs, f"peer-{i}") for i in range(2)]
    try:
        for rep in peers:
            rep.wait_ready()
        out = await measure("fastmcp-tasks", [rep.url for rep in peers], r, sizes)
        # The runner must be known: stop one replica, create on the other (its only worker),
        # then start a survivor and SIGKILL the runner.
        peers[1].stop()

        def start_survivor() -> str:
            survivor = peer_replica(python, f"{url}/1", logs, "peer-survivor")
            peers.append(survivor)
            survivor.wait_ready()
            return survivor.url

        async with httpx.AsyncClient(timeout=30) as http:
            out["kill"] = await kill_to_failed(
                http, peers[0], start_survivor, "countdown", PEER_KILL_WINDOW
            )
        return out
    finally:
        for rep in peers:
            rep.stop()


def goals(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Each goal: (goal, what was measured, met / missed / not measurable)."""
    ours, peer = results["replaystore"], results["peer"]
    rows: list[tuple[str, str, str]] = []
    if peer is None:
        rows.append(
            ("p99 no worse than the peer", f"{ours['latency']['p99_ms']} ms / -", "not measurable")
        )
        rows.append(("Redis CPU per task life <= 0.5x the peer's", "-", "not measurable"))
    else:
        a, b = ours["latency"]["p99_ms"], peer["latency"]["p99_ms"]
        rows.append(
            ("p99 no worse than the peer", f"{a} ms / {b} ms", "met" if a <= b else "missed")
        )
        c, d = ours["http_life"]["cpu_us_per_life"], peer["http_life"]["cpu_us_per_life"]
        ratio = c / d if d else float("inf")
        rows.append(
            (
                "Redis CPU per task life <= 0.5x the peer's (create, result, 20 polls)",
                f"{c} us / {d} us = {ratio:.2f}x",
                "met" if ratio <= 0.5 else "missed",
            )
        )
    kill = ours["kill"]
    # The client polls every 50 ms and each poll is a round trip: 0.1 s of slack.
    ok = kill["status"] == "failed" and kill["seconds"] <= LEASE_SECONDS + 0.1
    rows.append(
        (
            f"runner SIGKILL to failed within the lease ({LEASE_SECONDS} s)",
            f"{kill['status']} after {kill['seconds']} s",
            "met" if ok else "missed",
        )
    )
    return rows


def render(results: dict[str, Any]) -> str:
    mode = "quick" if results["meta"]["quick"] else "full"
    version = results["meta"]["redis_server"]
    lines = [f"tasks benchmark ({mode}), redis-server {version}; indicative, shared machine"]
    systems = [("replaystore", results["replaystore"])]
    if results["peer"] is not None:
        systems.append(("fastmcp-tasks", results["peer"]))
    for name, m in systems:
        lat, life = m["latency"], m["http_life"]
        gets = ", ".join(f"{g['per_second']}" for g in m["gets"])
        kill = m["kill"]
        lines += [
            f"{name}:",
            f"  tools/call -> resolvable on another replica: p50 {lat['p50_ms']} ms, "
            f"p99 {lat['p99_ms']} ms ({lat['tasks']} tasks)",
            f"  tasks/get per second per replica (8 callers): {gets}",
            f"  Redis per task life over HTTP (create, result, 20 polls): "
            f"CPU {life['cpu_us_per_life']} us, {life['commands_per_life']} commands, "
            f"commandstats {life['commandstats_us_per_life']} us; {life['top_commands']}",
            f"  Redis CPU with the replicas idle: {m['idle_cpu_us_per_s']} us per second; "
            f"the task lives above took {life['seconds']} s",
            f"  runner SIGKILL: {kill['status_before_kill']} -> {kill['status']} "
            f"after {kill['seconds']} s (window {kill['window_s']} s)",
        ]
    store = results["replaystore_store_life"]
    lines.append(
        "replaystore task store alone (create, 10 status changes, result, 20 polls): "
        f"CPU {store['cpu_us_per_life']} us, {store['commands_per_life']} commands, "
        f"commandstats {store['commandstats_us_per_life']} us; {store['top_commands']}"
    )
    if results["peer"] is None:
        lines.append(f"fastmcp-tasks: not measured ({results['meta'].get('peer_skipped')})")
    lines.append("goals:")
    lines += [f"  {g}: {value}: {verdict}" for g, value, verdict in goals(results)]
    return "\n".join(lines)


def run_all(
    *, quick: bool, peer_python: str | None = DEFAULT_PEER_PYTHON, json_path: Path | None = None
) -> dict[str, Any]:
    """The whole benchmark; the peer only when ``peer_python`` is an interpreter that has it."""
    skipped = "not asked for" if peer_python is None else None
    if peer_python is not None and not os.access(peer_python, os.X_OK):
        skipped = f"no interpreter at {peer_python}"
        peer_python = None
    elif peer_python is not None:
        check = subprocess.run(
            [peer_python, "-c", "import fastmcp_tasks"], capture_output=True, check=False
        )
        if check.returncode != 0:
            skipped = f"{peer_python} cannot import fastmcp_tasks"
            peer_python = None
    results = asyncio.run(run(quick, peer_python))
    if skipped:
        results["meta"]["peer_skipped"] = skipped
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2) + "\n")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the smoke test's mode)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--peer-python",
        default=DEFAULT_PEER_PYTHON,
        help="python of a venv with fastmcp-tasks installed ('' to skip the peer)",
    )
    args = parser.parse_args()
    results = run_all(quick=args.quick, peer_python=args.peer_python or None, json_path=args.json)
    print(render(results))


if __name__ == "__main__":
    main()

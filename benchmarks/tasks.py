"""Durable tasks behind a round-robin proxy: replaystore against FastMCP + ``fastmcp-tasks``.

Three deployments, measured one after the other in one run, each as three
replicas behind :class:`~replaystore.testing.TcpProxy` (round robin) with a
client that opens a new connection per request, so consecutive requests land
on different replicas:

- ``replaystore``: three ``benchmarks.tasks_server`` processes on one
  throw-away Redis;
- ``replaystore-memory``: three apps on ``memory://NAME`` in one process
  (replicas sharing an in-process store: no Redis, no Redis CPU figure, and no
  runner death, since the store dies with the runner);
- ``fastmcp-tasks``: three FastMCP servers with ``fastmcp-tasks``'
  ``TasksExtension`` (``fastmcp_tasks_peer.py``) on the same Redis; it pins
  another FastMCP and so runs from its own virtual environment
  (``--peer-python``, default ``/tmp/ft/bin/python``); without one it is not
  measured.

Absolute numbers are indicative only on a shared machine; the ratios between
deployments of one run are the figures.

    python -m benchmarks.tasks [--quick] [--json PATH] [--peer-python PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from replaystore import ReplayBuffer
from replaystore.backends.coordination import coordination_of
from replaystore.bench.servers import ServerProcess as Process
from replaystore.testing import TcpProxy
from replaystore.testing.servers import find_free_port

from .common import commandstats, redis_server

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = "io.modelcontextprotocol/tasks"
PEER_SCRIPT = Path(__file__).with_name("fastmcp_tasks_peer.py")
DEFAULT_PEER_PYTHON = "/tmp/ft/bin/python"
REPLICAS = 3
LEASE_SECONDS = 2.0
PEER_KILL_WINDOW = 30.0
POLL_STEP = 0.05
"""Seconds between two polls of a client waiting for a status change."""
ROUNDS = 5
"""Questions per full task life: 10 status changes (working <-> input_required)."""
FINAL_POLLS = 20
TERMINAL = ("completed", "failed", "cancelled")
OURS, MEMORY, PEER = "replaystore", "replaystore-memory", "fastmcp-tasks"
_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "benchmarks", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
}
_ids = itertools.count(1)


def ours_process(store: str, logs: Path, name: str, replicas: int = 1) -> Process:
    ports = [find_free_port() for _ in range(replicas)]
    args = [sys.executable, "-m", "benchmarks.tasks_server", store, str(LEASE_SECONDS)]
    return Process([*args, *map(str, ports)], ports, logs / f"{name}.log", cwd=ROOT).start()


def peer_process(python: str, url: str, logs: Path, name: str) -> Process:
    port = find_free_port()
    argv = [python, str(PEER_SCRIPT), str(port), url]
    return Process(argv, [port], logs / f"{name}.log", cwd=ROOT).start()


@dataclass
class Deployment:
    """Replica processes behind one round-robin proxy; ``redis`` when they use the Redis."""

    name: str
    processes: list[Process]
    redis: bool
    proxy: TcpProxy = field(init=False)

    def __post_init__(self) -> None:
        for process in self.processes:
            process.wait_ready()
        self.proxy = TcpProxy(self.upstreams()).start()

    def upstreams(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", p) for proc in self.processes for p in proc.ports]

    def client(self) -> Client:
        return Client(self.proxy.host, self.proxy.port)

    def stop(self) -> None:
        self.proxy.stop()
        for process in self.processes:
            process.stop()


@contextmanager
def deployed(name: str, start: Callable[[], list[Process]], redis: bool) -> Iterator[Deployment]:
    processes: list[Process] = []
    try:
        processes = start()
        deployment = Deployment(name, processes, redis)
    except BaseException:
        for process in processes:
            process.stop()
        raise
    try:
        yield deployment
    finally:
        deployment.stop()


class Client:
    """A minimal HTTP/1.1 client: every request on a new connection (``Connection: close``).

    Through the round-robin proxy each request then lands on the next replica.
    Not httpx: with a new connection per request it costs about four times
    the client CPU of this one on this machine, and the client shares the
    machine (and its process, the proxy's) with the servers it loads.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One 2026-07-28 JSON-RPC request declaring the tasks extension; the response."""
        return await asyncio.wait_for(self._send(method, params), 30)

    async def _send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": next(_ids),
                "method": method,
                "params": {**params, "_meta": _META},
            }
        ).encode()
        name = str(params.get("name") or params.get("taskId") or "")
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Accept: application/json, text/event-stream\r\nConnection: close\r\n"
            f"MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: {method}\r\nMcp-Name: {name}\r\n\r\n"
        )
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(head.encode() + body)
            data = await reader.read()
        finally:
            writer.close()
        return _message(data)


def _message(response: bytes) -> dict[str, Any]:
    """The JSON-RPC message of an HTTP response (a JSON body, or SSE ``data:`` lines)."""
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        chunks, rest = [], body
        while True:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            chunks.append(rest[:n])
            rest = rest[n + 2 :]
        body = b"".join(chunks)
    if headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in body.splitlines() if line.startswith(b"data:")]
        body = next((d for d in reversed(data) if d), b"")
    try:
        message: dict[str, Any] = json.loads(body)
    except ValueError:
        raise RuntimeError(f"not a JSON-RPC response: {lines[0]!r} {body[:200]!r}") from None
    return message


async def create(client: Client, tool: str, args: dict[str, Any]) -> str:
    reply = await client.send("tools/call", {"name": tool, "arguments": args})
    task_id: str = reply["result"]["taskId"]
    return task_id


async def get(client: Client, task_id: str) -> dict[str, Any] | None:
    reply = await client.send("tasks/get", {"taskId": task_id})
    result: dict[str, Any] | None = reply.get("result")
    return result


async def wait_for(
    client: Client, task_id: str, statuses: tuple[str, ...]
) -> tuple[dict[str, Any], int]:
    """Poll every ``POLL_STEP`` until the task is in one of ``statuses``; (task, gets)."""
    for polls in range(1, 2000):
        task = await get(client, task_id)
        if task is not None and task["status"] in statuses:
            return task, polls
        await asyncio.sleep(POLL_STEP)
    raise RuntimeError(f"task {task_id} never reached {statuses}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(client: Client, count: int) -> dict[str, Any]:
    """``tools/call``, then ``tasks/get`` (on the next replica) until it resolves the task (ms)."""
    samples: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        task_id = await create(client, "countdown", {"n": 0})
        while await get(client, task_id) is None:
            pass
        samples.append((time.perf_counter() - start) * 1000)
    return {
        "tasks": count,
        "p50_ms": round(percentile(samples, 0.50), 2),
        "p99_ms": round(percentile(samples, 0.99), 2),
    }


async def gets_per_second(client: Client, count: int) -> dict[str, Any]:
    """``tasks/get`` of one finished task from 8 concurrent callers, over every replica."""
    task_id = await create(client, "countdown", {"n": 0})
    await wait_for(client, task_id, TERMINAL)

    async def worker(n: int) -> None:
        for _ in range(n):
            assert await get(client, task_id) is not None

    start = time.perf_counter()
    await asyncio.gather(*(worker(count // 8) for _ in range(8)))
    elapsed = time.perf_counter() - start
    total = count // 8 * 8 / elapsed
    return {
        "gets": count // 8 * 8,
        "per_second": round(total, 1),
        "per_second_per_replica": round(total / REPLICAS, 1),
    }


async def short_life(client: Client) -> int:
    """Create, then ``FINAL_POLLS`` gets (the task ends meanwhile); the gets sent."""
    task_id = await create(client, "countdown", {"n": 0})
    for _ in range(FINAL_POLLS):
        await get(client, task_id)
    return FINAL_POLLS


async def full_life(client: Client) -> int:
    """Create; ``ROUNDS`` questions, each seen by polling and answered; result; 20 polls.

    Returns the gets sent: the polls that waited for each change, plus the final 20.
    """
    task_id = await create(client, "survey", {"rounds": ROUNDS})
    gets = 0
    for _ in range(ROUNDS):
        task, polls = await wait_for(client, task_id, ("input_required", *TERMINAL))
        gets += polls
        if task["status"] != "input_required":
            raise RuntimeError(f"survey ended early: {task}")
        answers = {
            key: {"action": "accept", "content": {"name": "b"}} for key in task["inputRequests"]
        }
        await client.send("tasks/update", {"taskId": task_id, "inputResponses": answers})
    task, polls = await wait_for(client, task_id, TERMINAL)
    if task["status"] != "completed":
        raise RuntimeError(f"survey did not complete: {task}")
    for _ in range(FINAL_POLLS):
        await get(client, task_id)
    return gets + polls + FINAL_POLLS


async def cpu_seconds(r: aioredis.Redis) -> float:
    info = await r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def life_cost(
    r: aioredis.Redis | None, life: Callable[[], Awaitable[int]], lives: int
) -> dict[str, Any]:
    """Per task life: wall time, gets sent and, on Redis, its CPU and ``INFO commandstats``."""
    if r is not None:
        await r.config_resetstat()
        before = await cpu_seconds(r)
    start = time.perf_counter()
    gets = 0
    for _ in range(lives):
        gets += await life()
    elapsed = time.perf_counter() - start
    out: dict[str, Any] = {
        "lives": lives,
        "ms_per_life": round(elapsed * 1000 / lives, 1),
        "gets_per_life": round(gets / lives, 1),
        "cpu_us_per_life": None,
    }
    if r is None:
        return out
    cpu = await cpu_seconds(r) - before
    stats = await commandstats(r)
    for noise in ("config|resetstat", "info"):
        stats.pop(noise, None)
    top = sorted(stats.items(), key=lambda kv: -kv[1][0])[:6]
    out.update(
        cpu_us_per_life=round(cpu * 1e6 / lives, 1),
        commands_per_life=round(sum(c for c, _ in stats.values()) / lives, 1),
        top_commands={k: round(c / lives, 1) for k, (c, _) in top},
    )
    return out


async def idle_cpu(r: aioredis.Redis, seconds: float) -> float:
    """Redis CPU per second (us) with the replicas up and no client: their background work."""
    before = await cpu_seconds(r)
    await asyncio.sleep(seconds)
    return round((await cpu_seconds(r) - before) * 1e6 / seconds, 1)


async def store_life(redis_url: str, lives: int, r: aioredis.Redis) -> dict[str, Any]:
    """replaystore's task store alone (no HTTP): create, 10 status changes, result, 20 gets."""
    buffer = ReplayBuffer.from_url(f"{redis_url}?prefix=bs:")
    store = coordination_of(buffer.backend).task_store()

    async def life() -> int:
        task_id = uuid.uuid4().hex
        await store.create(task_id, runner="r", lease=30.0, ttl_ms=60_000)
        for _ in range(ROUNDS):  # working -> input_required -> working
            (key,) = await store.ask(task_id, "r", [{"method": "elicitation/create"}]) or [""]
            await store.respond(task_id, {key: {"action": "accept"}})
        await store.finish(task_id, "completed", result={"content": []})
        for _ in range(FINAL_POLLS):
            await store.get(task_id)
        return FINAL_POLLS

    try:
        await life()  # warm-up: scripts loaded
        return await life_cost(r, life, lives)
    finally:
        await store.aclose()
        await buffer.aclose()


async def measure(
    deployment: Deployment, r: aioredis.Redis, sizes: dict[str, int]
) -> dict[str, Any]:
    client, on_redis = deployment.client(), r if deployment.redis else None
    # Each replica process pauses once for ~100 ms within its first few dozen tasks, then
    # not again: a start-up cost, kept out of the steady-state figures.
    await latency(client, sizes["warmup"])
    if sizes["lives"] > 1:  # not in quick mode, where every second counts
        await full_life(client)
    out: dict[str, Any] = {
        "replicas": len(deployment.upstreams()),
        "in_process": not deployment.redis,
        "idle_cpu_us_per_s": await idle_cpu(r, sizes["idle_s"]) if on_redis else None,
        "latency": await latency(client, sizes["latency"]),
        "gets": await gets_per_second(client, sizes["gets"]),
        "full_life": await life_cost(on_redis, lambda: full_life(client), sizes["lives"]),
        "short_life": await life_cost(on_redis, lambda: short_life(client), sizes["short_lives"]),
        "kill": None,
    }
    if on_redis is not None:  # the replicas' background work during the lives, taken out
        for life in (out["full_life"], out["short_life"]):
            idle = out["idle_cpu_us_per_s"] * life["ms_per_life"] / 1000
            life["cpu_net_of_idle_us_per_life"] = round(life["cpu_us_per_life"] - idle, 1)
    print(f"  {deployment.name}: measured", file=sys.stderr)
    return out


async def kill_to_failed(
    deployment: Deployment,
    doomed: Process,
    survivors: Callable[[], list[tuple[str, int]]],
    window: float,
) -> dict[str, Any]:
    """SIGKILL the runner of a running task; poll the survivors until it ends or ``window``.

    The proxy sends the ``tools/call`` to ``doomed`` alone, then (once the
    task runs there) only to the addresses ``survivors`` returns.
    """
    deployment.proxy.set_upstreams([("127.0.0.1", p) for p in doomed.ports])
    client = deployment.client()
    task_id = await create(client, "countdown", {"n": 100_000, "interval_ms": 10})
    await asyncio.sleep(1.0)  # running on the runner
    deployment.proxy.set_upstreams(await asyncio.to_thread(survivors))
    before = await get(client, task_id)
    doomed.kill()
    killed = time.monotonic()
    status = before["status"] if before else None
    while time.monotonic() - killed < window:
        task = await get(client, task_id)
        status = task["status"] if task else None
        if status in TERMINAL:
            break
        await asyncio.sleep(POLL_STEP)
    seconds = time.monotonic() - killed
    return {
        "status_before_kill": before["status"] if before else None,
        "status": status,
        "seconds": round(seconds, 2),
        "window_s": window,
    }


async def run_ours(
    url: str, logs: Path, r: aioredis.Redis, sizes: dict[str, int]
) -> dict[str, Any]:
    def start() -> list[Process]:
        return [ours_process(f"{url}?prefix=bt:", logs, f"rs-{i}") for i in range(REPLICAS)]

    with deployed(OURS, start, redis=True) as deployment:
        out = await measure(deployment, r, sizes)
        doomed, rest = deployment.processes[0], deployment.processes[1:]
        out["kill"] = await kill_to_failed(
            deployment,
            doomed,
            lambda: [("127.0.0.1", p) for proc in rest for p in proc.ports],
            LEASE_SECONDS + 5,
        )
    return out


async def run_memory(logs: Path, r: aioredis.Redis, sizes: dict[str, int]) -> dict[str, Any]:
    def start() -> list[Process]:
        return [ours_process(f"memory://bench-{uuid.uuid4().hex[:8]}", logs, "memory", REPLICAS)]

    with deployed(MEMORY, start, redis=False) as deployment:
        return await measure(deployment, r, sizes)


async def run_peer(
    python: str, url: str, logs: Path, r: aioredis.Redis, sizes: dict[str, int]
) -> dict[str, Any]:
    def start() -> list[Process]:
        return [peer_process(python, f"{url}/1", logs, f"peer-{i}") for i in range(REPLICAS)]

    with deployed(PEER, start, redis=True) as deployment:
        out = await measure(deployment, r, sizes)
        # Any peer replica's worker may run a task: the runner is known only when one
        # replica is left. A survivor starts once the task runs there.
        doomed = deployment.processes[0]
        for process in deployment.processes[1:]:
            process.stop()

        def start_survivor() -> list[tuple[str, int]]:
            survivor = peer_process(python, f"{url}/1", logs, "peer-survivor")
            deployment.processes.append(survivor)
            survivor.wait_ready()
            return [("127.0.0.1", survivor.ports[0])]

        out["kill"] = await kill_to_failed(deployment, doomed, start_survivor, PEER_KILL_WINDOW)
    return out


async def run(quick: bool, peer_python: str | None) -> dict[str, Any]:
    sizes = (
        {
            "latency": 10,
            "warmup": 5,
            "gets": 80,
            "lives": 1,
            "short_lives": 5,
            "store_lives": 10,
            "idle_s": 1,
        }
        if quick
        else {
            "latency": 300,
            "warmup": 200,
            "gets": 2000,
            "lives": 50,
            "short_lives": 200,
            "store_lives": 1000,
            "idle_s": 5,
        }
    )
    logs = Path(tempfile.mkdtemp(prefix="replaystore-tasks-bench-"))
    meta = {
        "quick": quick,
        "sizes": sizes,
        "replicas": REPLICAS,
        "lease_s": LEASE_SECONDS,
        "poll_step_s": POLL_STEP,
        "rounds": ROUNDS,
    }
    results: dict[str, Any] = {"meta": meta}
    with redis_server() as server:
        r = aioredis.Redis.from_url(server.url)
        try:
            meta["redis_server"] = (await r.info("server"))["redis_version"]
            results["replaystore_store_life"] = await store_life(
                server.url, sizes["store_lives"], r
            )
            systems: dict[str, Any] = {}
            systems[OURS] = await run_ours(server.url, logs, r, sizes)
            systems[MEMORY] = await run_memory(logs, r, sizes)
            systems[PEER] = (
                None
                if peer_python is None
                else await run_peer(peer_python, server.url, logs, r, sizes)
            )
            results["systems"] = systems
        finally:
            await r.aclose()
    results["ratios"] = ratios(results)
    results["goals"] = [{"goal": g, "measured": m, "verdict": v} for g, m, v in goals(results)]
    return results


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Each replaystore deployment's figures divided by the peer's (None: not measurable)."""
    peer = results["systems"][PEER]
    out: dict[str, Any] = {}
    for name in (OURS, MEMORY):
        m = results["systems"][name]
        if peer is None:
            out[name] = None
            continue
        out[name] = {
            "p50": _ratio(m["latency"]["p50_ms"], peer["latency"]["p50_ms"]),
            "p99": _ratio(m["latency"]["p99_ms"], peer["latency"]["p99_ms"]),
            "gets_per_second": _ratio(
                m["gets"]["per_second_per_replica"], peer["gets"]["per_second_per_replica"]
            ),
            "full_life_cpu": _ratio(
                m["full_life"]["cpu_us_per_life"], peer["full_life"]["cpu_us_per_life"]
            ),
            "short_life_cpu": _ratio(
                m["short_life"]["cpu_us_per_life"], peer["short_life"]["cpu_us_per_life"]
            ),
            "full_life_time": _ratio(
                m["full_life"]["ms_per_life"], peer["full_life"]["ms_per_life"]
            ),
        }
    return out


def goals(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Each goal, for the Redis deployment: (goal, measured, met / missed / not measurable)."""
    ours, peer = results["systems"][OURS], results["systems"][PEER]
    rows: list[tuple[str, str, str]] = []
    a = ours["latency"]["p99_ms"]
    if peer is None:
        rows.append(("p99 no worse than the peer", f"{a} ms / -", "not measurable"))
        for life in ("full", "short"):
            rows.append(
                (f"Redis CPU per {life} task life <= 0.5x the peer's", "-", "not measurable")
            )
    else:
        b = peer["latency"]["p99_ms"]
        rows.append(
            ("p99 no worse than the peer", f"{a} ms / {b} ms", "met" if a <= b else "missed")
        )
        for life in ("full", "short"):
            c = ours[f"{life}_life"]["cpu_us_per_life"]
            d = peer[f"{life}_life"]["cpu_us_per_life"]
            ratio = c / d if d else float("inf")
            rows.append(
                (
                    f"Redis CPU per {life} task life <= 0.5x the peer's",
                    f"{c} us / {d} us = {ratio:.2f}x",
                    "met" if ratio <= 0.5 else "missed",
                )
            )
    kill = ours["kill"]
    # The client polls every POLL_STEP and each poll is a round trip: 0.1 s of slack.
    ok = kill["status"] == "failed" and kill["seconds"] <= LEASE_SECONDS + 0.1
    rows.append(
        (
            f"runner SIGKILL to failed within the lease ({LEASE_SECONDS} s)",
            f"{kill['status']} after {kill['seconds']} s",
            "met" if ok else "missed",
        )
    )
    return rows


def _cell(value: Any, unit: str = "") -> str:
    return "n/a" if value is None else f"{value}{unit}"


def render(results: dict[str, Any]) -> str:
    """The figures as one markdown table (a column per deployment), then the goals."""
    return "\n".join([*_table(results), *_notes(results)])


def _kill_cell(m: dict[str, Any], ours: bool) -> str:
    k = m["kill"]
    if k is None:
        return "n/a (the store dies with the runner)"
    text = f"{k['status_before_kill']} -> {k['status']} after {k['seconds']} s"
    return text + (f" (lease {LEASE_SECONDS} s)" if ours else "")


def _life_cell(m: dict[str, Any], which: str) -> str:
    x = m[which]
    if x["cpu_us_per_life"] is None:
        return "n/a"
    net = x["cpu_net_of_idle_us_per_life"]
    return f"{x['cpu_us_per_life']} us ({net} net of idle), {x['commands_per_life']} commands"


def _table(results: dict[str, Any]) -> list[str]:
    """The title and the table: a row per figure, a column per deployment measured."""
    meta = results["meta"]
    mode = "quick" if meta["quick"] else "full"
    names = [n for n in (OURS, MEMORY, PEER) if results["systems"][n] is not None]
    columns = {
        OURS: "replaystore, Redis",
        MEMORY: "replaystore, memory://NAME (in-process)",
        PEER: "FastMCP + fastmcp-tasks, Redis",
    }
    systems = {n: results["systems"][n] for n in names}
    ratio = results["ratios"][OURS]

    def row(label: str, cells: Callable[[dict[str, Any]], str], key: str | None = None) -> str:
        values = [cells(systems[n]) for n in names]
        if ratio is not None:
            values.append(_cell(ratio[key], "x") if key else "-")
        return f"| {label} | " + " | ".join(values) + " |"

    header = ["figure", *(columns[n] for n in names)]
    if ratio is not None:
        header.append("replaystore / peer")
    return [
        f"tasks benchmark ({mode}), {meta['replicas']} replicas each behind a round-robin "
        f"TcpProxy, a new connection per request; redis-server {meta['redis_server']}; "
        "indicative, shared machine",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        row(
            f"tools/call -> resolvable on another replica, p50 ({meta['sizes']['latency']} tasks)",
            lambda m: f"{m['latency']['p50_ms']} ms",
            "p50",
        ),
        row("the same, p99", lambda m: f"{m['latency']['p99_ms']} ms", "p99"),
        row(
            "tasks/get per second per replica (8 callers, all replicas)",
            lambda m: f"{m['gets']['per_second_per_replica']}",
            "gets_per_second",
        ),
        row(
            f"Redis CPU per full life (create, {2 * ROUNDS} status changes, result, "
            f"{FINAL_POLLS} polls)",
            lambda m: _life_cell(m, "full_life"),
            "full_life_cpu",
        ),
        row(
            "  its wall time; tasks/get sent",
            lambda m: f"{m['full_life']['ms_per_life']} ms; {m['full_life']['gets_per_life']}",
            "full_life_time",
        ),
        row(
            f"Redis CPU per short life (create, result, {FINAL_POLLS} polls)",
            lambda m: _life_cell(m, "short_life"),
            "short_life_cpu",
        ),
        row(
            "Redis CPU per second, replicas idle",
            lambda m: _cell(m["idle_cpu_us_per_s"], " us"),
        ),
        row(
            "runner SIGKILL, polling survivors",
            lambda m: _kill_cell(m, m is systems.get(OURS)),
        ),
    ]


def _notes(results: dict[str, Any]) -> list[str]:
    """What the table leaves out: the task store alone, the commands, the goals."""
    meta = results["meta"]
    store = results["replaystore_store_life"]
    lines = [
        "",
        f"replaystore task store alone (create, {2 * ROUNDS} status changes, result, "
        f"{FINAL_POLLS} gets; no HTTP): CPU {store['cpu_us_per_life']} us, "
        f"{store['commands_per_life']} commands; {store['top_commands']}",
    ]
    for name in (OURS, MEMORY, PEER):
        m = results["systems"][name]
        if m is not None and m["full_life"]["cpu_us_per_life"] is not None:
            lines.append(f"{name} full life commands: {m['full_life']['top_commands']}")
    if results["systems"][PEER] is None:
        lines.append(f"fastmcp-tasks: not measured ({meta.get('peer_skipped')})")
    lines.append("goals:")
    lines += [f"  {g['goal']}: {g['measured']}: {g['verdict']}" for g in results["goals"]]
    return lines


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

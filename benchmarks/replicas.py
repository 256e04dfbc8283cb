"""What serving a session from another replica costs: resumes, live tails, Redis connections.

    python -m benchmarks.replicas [--quick] [--clients N] [--json out.json]

Starts its own ``redis-server`` (never the machine's 6379) and two
``replaystore example-server`` processes, A and B, on it: replicas of
each other. Everything is measured from a client over real HTTP, and every
figure is a ratio against a baseline measured in the same run:

- **resume**: ``GET`` + ``Last-Event-ID`` replaying the same finished 100-event
  tool call, served by B (which did not run the call and adopts the session)
  vs served by A (which ran it); alternating rounds, median per resume.
- **live tail**: a ``broadcast`` POSTed to A, delivered on a GET stream
  attached to B vs on one attached to A; p50 and p99 from the POST to the
  delivery.
- **connections**: the Redis connections each replica's process holds (read
  from ``/proc``, Linux only) with 10, ``--clients / 10`` and ``--clients``
  GET streams attached to B for sessions created on A.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from replaystore.bench.servers import Servers
from replaystore.testing.mcp import RawSession
from replaystore.testing.servers import find_free_port, redis_server_binary, start_standalone
from replaystore.testing.sse import sse_events

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Replica:
    """One ``python -m replaystore.mcp.example`` process: where it serves MCP, its pid."""

    url: str
    pid: int


def _commands(url: str) -> list[tuple[list[str], list[int]]]:
    commands = []
    for _ in range(2):
        port = find_free_port()
        argv = [
            sys.executable,
            "-m",
            "replaystore",
            "example-server",
            "--port",
            str(port),
            "--url",
            url,
        ]
        commands.append((argv, [port]))
    return commands


# ---------------------------------------------------------------- a raw MCP client


async def _call(session: RawSession, tool: str, arguments: dict[str, Any]) -> list[str]:
    """Run a tool to its result; the event ids of its stream."""
    return [e.id for e in await session.run(tool, arguments, token="p") if e.id]


def _at(session: RawSession, url: str) -> RawSession:
    """The same session, its requests sent to ``url`` (another replica)."""
    return replace(session, url=url)


# ---------------------------------------------------------------- measurements


async def _resume_once(session: RawSession, url: str, cursor: str) -> tuple[float, int]:
    started = time.perf_counter()
    count = 0
    async with _at(session, url).get(cursor) as r:
        async for event in sse_events(r):
            count += not event.priming
    return time.perf_counter() - started, count


async def measure_resume(a: Replica, b: Replica, rounds: int, per_round: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as http:
        session = await RawSession(http, a.url).initialize()
        ids = await _call(session, "countdown", {"n": 100, "interval_ms": 0})
        cursor = ids[0]  # the stream's priming event: a resume replays all 100 + the result
        for url in (a.url, b.url):  # warm-up (B adopts the session here)
            for _ in range(5):
                await _resume_once(session, url, cursor)
        same: list[float] = []
        other: list[float] = []
        ratios: list[float] = []
        replayed = set()
        for _ in range(rounds):
            round_same: list[float] = []
            round_other: list[float] = []
            for _ in range(per_round):
                seconds, n = await _resume_once(session, a.url, cursor)
                round_same.append(seconds)
                replayed.add(n)
                seconds, n = await _resume_once(session, b.url, cursor)
                round_other.append(seconds)
                replayed.add(n)
            same += round_same
            other += round_other
            ratios.append(statistics.median(round_other) / statistics.median(round_same))
    return {
        "events_replayed": sorted(replayed),
        "same_replica_ms": statistics.median(same) * 1000,
        "other_replica_ms": statistics.median(other) * 1000,
        "ratio": statistics.median(other) / statistics.median(same),
        "round_ratios": [min(ratios), max(ratios)],
        "target": "<= 1.5",
    }


async def measure_tail(a: Replica, b: Replica, samples: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as http:
        results: dict[str, list[float]] = {}
        for label, attach in (("same_replica", a), ("other_replica", b)):
            session = await RawSession(http, a.url).initialize()
            arrived: asyncio.Queue[float] = asyncio.Queue()

            async def listen(
                session: RawSession = session,
                attach: Replica = attach,
                arrived: asyncio.Queue[float] = arrived,
            ) -> None:
                async with _at(session, attach.url).get() as r:
                    async for event in sse_events(r):
                        if not event.priming:
                            arrived.put_nowait(time.perf_counter())

            listener = asyncio.create_task(listen())
            await asyncio.sleep(0.3)  # attached
            latencies: list[float] = []
            for _ in range(samples):
                sent = time.perf_counter()
                await _call(session, "broadcast", {"n": 1})
                received = await asyncio.wait_for(arrived.get(), 10)
                latencies.append(received - sent)
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            results[label] = latencies
    same, other = results["same_replica"], results["other_replica"]
    return {
        "same_replica_ms": {"p50": _pct(same, 50), "p99": _pct(same, 99)},
        "other_replica_ms": {"p50": _pct(other, 50), "p99": _pct(other, 99)},
        "p50_ratio": _pct(other, 50) / _pct(same, 50),
        "p99_ratio": _pct(other, 99) / _pct(same, 99),
    }


def _pct(values: list[float], pct: int) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))
    return ordered[index] * 1000


def redis_connections(pid: int, redis_port: int) -> int:
    """TCP connections of process ``pid`` to the Redis port (from /proc; Linux)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                remote_port = int(parts[2].rsplit(":", 1)[1], 16)
                if remote_port == redis_port and parts[3] == "01" and parts[9] in inodes:
                    count += 1
    return count


async def measure_connections(
    a: Replica, b: Replica, redis_port: int, steps: list[int]
) -> dict[str, Any]:
    rows = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        holders: list[asyncio.Task[None]] = []
        attached = 0
        joined: asyncio.Queue[None] = asyncio.Queue()

        async def hold() -> None:
            session = await RawSession(http, a.url).initialize()
            async with _at(session, b.url).get() as r:
                async for _ in sse_events(r):  # the priming event: attached
                    joined.put_nowait(None)
                    await asyncio.sleep(3600)

        for target in steps:
            while attached < target:
                batch = min(10, target - attached)  # bounded concurrency: steady state, not a burst
                holders += [asyncio.create_task(hold()) for _ in range(batch)]
                attached += batch
                for _ in range(batch):
                    await asyncio.wait_for(joined.get(), 60)
            await asyncio.sleep(1.0)
            rows.append(
                {
                    "attached_clients": target,
                    "replica_a": redis_connections(a.pid, redis_port),
                    "replica_b": redis_connections(b.pid, redis_port),
                }
            )
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    return {"rows": rows}


async def run(quick: bool, clients: int, logs: Path) -> dict[str, Any]:
    handle = start_standalone(redis_server_binary(), "redis")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        with Servers(_commands(handle.url), cwd=ROOT, env=env, logs=logs) as servers:
            a, b = (
                Replica(f"http://{h}:{p}/mcp", s.pid)
                for s, (h, p) in zip(servers.servers, servers.addresses, strict=True)
            )
            return {
                "resume": await measure_resume(a, b, 3 if quick else 7, 5 if quick else 30),
                "live_tail": await measure_tail(a, b, 20 if quick else 300),
                "connections": await measure_connections(
                    a, b, handle.ports[0], [10, 30] if quick else [10, clients // 10, clients]
                ),
            }
    finally:
        handle.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replicas", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (ratios are noise)")
    parser.add_argument("--clients", type=int, default=1000, help="attached GET streams, top step")
    parser.add_argument("--json", type=Path, default=None, help="write the report here too")
    args = parser.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"replicas-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(run(args.quick, args.clients, logs))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

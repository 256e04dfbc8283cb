"""What task replicas cost Redis while nothing happens, and while tasks run.

On one throw-away ``redis-server`` per round: Redis's CPU per second
(``INFO cpu``, ``used_cpu_sys + used_cpu_user``) with no client connected
(its own timers), then with ``--replicas`` idle ``example-server`` replicas,
then with ``--tasks`` long ``countdown`` tasks running on each replica; with
the round trips per second the replicas make (``INFO stats``
``total_reads_processed``) and the commands they run (``INFO commandstats``,
commands run by Lua included). ``--src`` runs the replicas from another checkout of
the repository (its ``replaystore`` package; repeatable), so two commits are
compared in the same run, alternating round by round::

    python -m benchmarks.task_idle [--src DIR ...] [--rounds 3] [--seconds 30] [--json PATH]

Absolute CPU figures move by a few hundred microseconds per second between
rounds on a shared machine: compare the commands, and CPU only within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

from replaystore.bench.servers import HOST, Servers
from replaystore.testing.servers import find_free_port

from .common import commandstats, redis_server

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = "io.modelcontextprotocol/tasks"
_NOISE = ("info", "config|resetstat")


async def _measure(r: aioredis.Redis, seconds: float) -> dict[str, Any]:
    """Redis CPU (us) and commands per second over ``seconds`` of whatever runs now."""
    await r.config_resetstat()
    before = {**await r.info("cpu"), **await r.info("stats")}
    start = time.monotonic()
    await asyncio.sleep(seconds)
    after = {**await r.info("cpu"), **await r.info("stats")}
    elapsed = time.monotonic() - start
    stats = await commandstats(r)
    cpu = sum(float(after[k]) - float(before[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    calls = {k: c / elapsed for k, (c, _) in stats.items() if k not in _NOISE}
    # Read events: about one per round trip a client makes (less the INFO calls here).
    reads = int(after["total_reads_processed"]) - int(before["total_reads_processed"]) - 2
    return {
        "cpu_us_per_s": round(cpu * 1e6 / elapsed, 1),
        "reads_per_s": round(reads / elapsed, 2),
        "commands_per_s": round(sum(calls.values()), 2),
        "by_command": {k: round(v, 2) for k, v in sorted(calls.items(), key=lambda kv: -kv[1])},
    }


def _replicas(src: Path, url: str, count: int, logs: Path) -> Servers:
    """Example-server replicas run from ``src`` (so ``-m replaystore`` is that checkout's)."""
    commands = []
    for _ in range(count):
        port = find_free_port()
        argv = [
            sys.executable, "-m", "replaystore", "example-server", "--host", HOST,
            "--port", str(port), "--url", f"{url}?prefix=ti:", "--log-level", "error",
        ]  # fmt: skip
        commands.append((argv, [port]))
    return Servers(commands, cwd=src, logs=logs, ready_timeout=120.0, stop_timeout=15.0)


async def _start_task(http: httpx.AsyncClient, url: str) -> None:
    """A long ``countdown`` as a task (a 2026-07-28 ``tools/call`` declaring the extension)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "benchmarks", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
    }
    params = {"name": "countdown", "arguments": {"n": 1_000_000, "interval_ms": 1000}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "countdown",
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {**params, "_meta": meta}}
    response = await http.post(url, json=body, headers=headers)
    if "taskId" not in response.text:
        raise RuntimeError(f"no task created: {response.text[:300]}")


async def _one(src: Path, sizes: argparse.Namespace, logs: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with redis_server() as server:
        r = aioredis.Redis.from_url(server.url)
        try:
            out["redis_alone"] = await _measure(r, sizes.seconds)
            replicas = _replicas(src, server.url, sizes.replicas, logs)
            try:
                await asyncio.to_thread(replicas.start)
                await asyncio.sleep(sizes.settle)  # connections open, first scans done
                out["idle"] = await _measure(r, sizes.seconds)
                if sizes.tasks:
                    async with httpx.AsyncClient(timeout=30) as http:
                        for host, port in replicas.addresses:
                            for _ in range(sizes.tasks):
                                await _start_task(http, f"http://{host}:{port}/mcp")
                    await asyncio.sleep(sizes.settle)
                    out["running"] = await _measure(r, sizes.seconds)
            finally:  # all at once, then wait for each
                await asyncio.to_thread(replicas.stop)
        finally:
            await r.aclose()
    return out


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for phase in rounds[0]:
        cpu = [round_[phase]["cpu_us_per_s"] for round_ in rounds]
        commands = [round_[phase]["commands_per_s"] for round_ in rounds]
        reads = [round_[phase]["reads_per_s"] for round_ in rounds]
        summary[phase] = {
            "cpu_us_per_s_median": round(statistics.median(cpu), 1),
            "cpu_us_per_s_range": [min(cpu), max(cpu)],
            "reads_per_s_median": round(statistics.median(reads), 2),
            "commands_per_s_median": round(statistics.median(commands), 2),
            "by_command_last_round": rounds[-1][phase]["by_command"],
        }
    return summary


async def run(sizes: argparse.Namespace, sources: list[Path]) -> dict[str, Any]:
    logs = Path(tempfile.mkdtemp(prefix="replaystore-task-idle-"))
    rounds: dict[str, list[dict[str, Any]]] = {str(src): [] for src in sources}
    for i in range(sizes.rounds):
        for src in sources:
            rounds[str(src)].append(await _one(src, sizes, logs))
            print(f"  round {i + 1}, {src}: done", file=sys.stderr)
    return {
        "meta": {k: v for k, v in vars(sizes).items() if k != "json"},
        "results": {src: {"rounds": r, "summary": _summary(r)} for src, r in rounds.items()},
    }


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"task replicas and Redis CPU: {meta['replicas']} replicas, {meta['tasks']} tasks each "
        f"when running, {meta['seconds']} s per phase, {meta['rounds']} rounds "
        "(median [range]); indicative, shared machine"
    ]
    for src, result in results["results"].items():
        lines.append(f"{src}:")
        for phase, row in result["summary"].items():
            low, high = row["cpu_us_per_s_range"]
            top = ", ".join(f"{k} {v}" for k, v in list(row["by_command_last_round"].items())[:6])
            lines.append(
                f"  {phase}: CPU {row['cpu_us_per_s_median']} us/s [{low}-{high}], "
                f"{row['reads_per_s_median']} round trips/s, "
                f"{row['commands_per_s_median']} commands/s ({top})"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], help="a checkout to run from")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20, help="tasks per replica (0: none)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds before a phase is measured"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    sources = [Path(s).resolve() for s in args.src] or [ROOT]
    results = asyncio.run(run(args, sources))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(render(results))


if __name__ == "__main__":
    main()

"""Instructions Redis executes per append, counted with callgrind: the stable form of a CPU ratio.

    python -m benchmarks.append_instructions [--calls N] [--warmup N] [--json PATH]

Redis CPU measured from ``INFO cpu`` moves by tens of percent between runs on
a shared machine; the instructions the server executes for the same calls do
not. This starts a private ``redis-server`` under ``valgrind --tool=callgrind``
(free loopback port, no persistence) with instrumentation off, warms every
subject up, then counts each phase alone: ``callgrind_control -i on``, N calls,
``-i off``, ``--dump``, and the dump's total of user-space instructions (the
kernel's share of a round trip is not counted, nor the client's).

The phases: ``append`` of one 200-byte event through the public
``ReplayBuffer`` (one sequence; three sequences written in turn, as an MCP
session's streams are), the Lua floor of ``benchmarks.targets`` (the four
commands any atomic append in Lua needs and nothing else) and a raw ``XADD``.
The ratios append / floor are the instruction form of the target "append of
one event / the Lua floor, Redis CPU".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from replaystore import ReplayBuffer
from replaystore.testing.servers import find_free_port, redis_server_binary

from .common import payload
from .targets import _FLOOR_LIBRARY

Op = Callable[[int], Awaitable[object]]


@dataclass
class _Server:
    """A callgrind-run redis-server: its port, process and dump directory."""

    port: int
    proc: subprocess.Popen[bytes]
    out: Path
    dumps: int = 0

    def control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.proc.pid)],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def count(self) -> int:
        """Dump the counters (which resets them) and return the instructions collected."""
        self.control("--dump")
        self.dumps += 1
        path = self.out.with_name(f"{self.out.name}.{self.dumps}")
        for _ in range(600):  # the dump is written by the server process
            if path.exists():
                match = re.search(r"^totals:\s*(\d+)", path.read_text(), re.MULTILINE)
                if match:
                    return int(match.group(1))
            time.sleep(0.05)
        raise RuntimeError(f"callgrind wrote no dump at {path}")


@contextmanager
def callgrind_redis() -> Iterator[_Server]:
    """A private redis-server under callgrind, instrumentation off until asked for."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found on PATH")
    root = Path(tempfile.mkdtemp(prefix="append-instructions-"))
    out = root / "callgrind.out"
    port = find_free_port()
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            redis_server_binary(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=(root / "valgrind.log").open("wb"),
    )
    try:
        yield _Server(port, proc, out)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


async def _wait_for_ping(r: aioredis.Redis, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("redis-server under valgrind exited")
        try:
            await r.ping()
            return
        except (ConnectionError, OSError, aioredis.ConnectionError):
            await asyncio.sleep(0.1)
    raise RuntimeError("redis-server under valgrind did not answer PING")


async def _measure(server: _Server, calls: int, warmup: int) -> dict[str, Any]:
    url = f"redis://127.0.0.1:{server.port}/0"
    # Everything under valgrind is tens of times slower: generous timeouts.
    r = aioredis.Redis.from_url(url, socket_timeout=120)
    await _wait_for_ping(r, server.proc)
    payloads = [payload(i) for i in range(256)]
    out: dict[str, int] = {}
    try:
        async with ReplayBuffer.from_url(
            url, prefix="ai:", max_events=10**7, socket_timeout=120
        ) as buf:
            await buf.open_session("one")
            await buf.open_session("turn")
            turn = ("_GET_stream", "1", "2")

            async def append_one(i: int) -> object:
                return await buf.append("one", "s1", payloads[i % 256])

            async def append_in_turn(i: int) -> object:
                return await buf.append("turn", turn[i % 3], payloads[i % 256])

            await r.function_load(_FLOOR_LIBRARY, replace=True)
            await r.hset("floor:{f}:m", mapping={"epoch": "e", "top": 0, "count": 0})

            async def lua_floor(i: int) -> object:
                return await r.fcall(
                    "replaystore_bench_floor", 2, "floor:{f}:m", "floor:{f}:q", payloads[i % 256]
                )

            async def xadd(i: int) -> object:
                return await r.xadd("raw:xadd", {"d": payloads[i % 256]})

            phases: dict[str, Op] = {
                "append": append_one,
                "append_in_turn": append_in_turn,
                "floor": lua_floor,
                "xadd": xadd,
            }
            for op in phases.values():
                for i in range(warmup):
                    await op(i)
            for name, op in phases.items():
                server.control("-i", "on")
                for i in range(warmup, warmup + calls):
                    await op(i)
                server.control("-i", "off")
                out[name] = server.count()
    finally:
        await r.aclose()
    per_call = {name: round(total / calls) for name, total in out.items()}
    return {
        "calls": calls,
        "instructions_per_call": per_call,
        "append_vs_floor": round(per_call["append"] / per_call["floor"], 3),
        "append_in_turn_vs_floor": round(per_call["append_in_turn"] / per_call["floor"], 3),
    }


def run(calls: int = 2000, warmup: int = 200) -> dict[str, Any]:
    """Count each phase on a fresh callgrind server; instructions per call and the ratios."""
    with callgrind_redis() as server:
        return asyncio.run(_measure(server, calls, warmup))


def render(results: dict[str, Any]) -> str:
    lines = [f"Redis user-space instructions per call (callgrind, {results['calls']} calls each)"]
    for name, count in results["instructions_per_call"].items():
        lines.append(f"  {name:<16} {count:>10,}")
    lines.append(
        f"append / floor: {results['append_vs_floor']:.3f}x (one sequence), "
        f"{results['append_in_turn_vs_floor']:.3f}x (three sequences in turn)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per phase")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured calls per phase")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = run(args.calls, args.warmup)
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

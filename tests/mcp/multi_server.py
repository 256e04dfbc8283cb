"""Serve several independent MCP apps from one process, each on its own port (tests only).

Why: importing the MCP SDK costs seconds of CPU per process, and the test
machines have two cores. The apps share nothing but the interpreter: each has
its own ReplayBuffer (its own Redis connections or memory store), its own
session manager and its own port, exactly as separate processes would.
The replica test still runs its two replicas in two different processes.

Usage: ``python -m tests.mcp.multi_server '<json list of [name, kind, port, url, max_events]>'``
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # signals are handled once for all servers below


def build(kind: str, url: str, max_events: int) -> Any:
    if kind == "sdk":
        from replaystore.mcp.example import build_app

        return build_app(url, max_events)
    from tests.mcp.fastmcp_app import build_app as build_fastmcp

    return build_fastmcp(url, max_events)


async def main(specs: list[list[Any]]) -> None:
    servers = [
        _Server(
            uvicorn.Config(
                build(kind, url, int(max_events)),
                host="127.0.0.1",
                port=int(port),
                log_level="warning",
                lifespan="on",
            )
        )
        for _name, kind, port, url, max_events in specs
    ]
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):

        def stop() -> None:
            for server in servers:
                server.should_exit = True

        loop.add_signal_handler(sig, stop)
    await asyncio.gather(*(server.serve() for server in servers))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))

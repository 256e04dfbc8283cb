"""replaystore's server for ``benchmarks.tasks``: the example server's parts plus ``survey``.

The app is assembled as ``replaystore example-server`` assembles its own
(``build_server``'s tools, a :class:`ReplayTasks`, a store-backed listen bus,
``streamable_http_app``), with one more tool: ``survey(rounds)`` asks
``rounds`` questions with ``ctx.elicit``, so one task goes through
``working -> input_required -> working`` as often as a benchmark needs.
``countdown`` is not idempotent here: a task whose runner is killed must end
``failed``, the figure the benchmark measures.

    python -m benchmarks.tasks_server URL LEASE_SECONDS PORT [PORT ...]

serves one app per port, all in this process: with ``memory://NAME`` they are
replicas sharing one in-process store; with a Redis URL, run one process per
replica instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Iterator

import uvicorn
from mcp.server.elicitation import AcceptedElicitation
from mcp.server.mcpserver import Context
from pydantic import BaseModel
from starlette.applications import Starlette

from replaystore import ReplayBuffer
from replaystore.mcp import StoreSubscriptionBus, streamable_http_app
from replaystore.mcp.example import build_server
from replaystore.mcp.tasks import ReplayTasks

POLL_INTERVAL = 0.5


class _Name(BaseModel):
    name: str


def build_app(url: str, lease: float) -> Starlette:
    """One replica on the store at ``url``, tasks leased for ``lease`` seconds."""
    tasks = ReplayTasks(
        {"countdown": "optional", "survey": "optional"},
        lease=lease,
        check_interval=min(0.25, lease / 4),
        poll_interval=POLL_INTERVAL,
    )
    bus = StoreSubscriptionBus()
    server = build_server(tasks, bus)

    @server.tool()
    async def survey(ctx: Context, rounds: int = 1) -> str:
        """Ask ``rounds`` questions in turn, then say how many were answered."""
        answered = 0
        for i in range(rounds):
            reply = await ctx.elicit(f"question {i + 1}", _Name)
            answered += isinstance(reply, AcceptedElicitation)
        return f"answered {answered}"

    buffer = ReplayBuffer.from_url(url)
    app = streamable_http_app(server, buffer, lease_ttl=lease, tasks=tasks, subscriptions=bus)
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(starlette_app: Starlette) -> AsyncIterator[None]:
        async with buffer, inner(starlette_app):
            yield

    app.router.lifespan_context = lifespan
    return app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # one handler below stops every app of the process


async def serve(url: str, lease: float, ports: list[int]) -> None:
    servers = [
        _Server(uvicorn.Config(build_app(url, lease), host="127.0.0.1", port=p, log_level="error"))
        for p in ports
    ]

    def stop() -> None:
        for server in servers:
            server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    await asyncio.gather(*(server.serve() for server in servers))


def main() -> None:
    url, lease, *ports = sys.argv[1:]
    if not ports:
        raise SystemExit(__doc__)
    asyncio.run(serve(url, float(lease), [int(p) for p in ports]))


if __name__ == "__main__":
    main()

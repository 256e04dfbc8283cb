"""An MCP server on a peer's event store, for ``bench storm --http``.

``python -m replaystore.bench.peer_server STORE --port P [--url redis://… --prefix P]``

The same ``countdown`` tool as ``replaystore example-server`` (progress
notifications, the SSE stream closed after ``close_after`` of them), served the
way a user of that peer serves it today, so the HTTP storm compares stores and
not servers:

- ``sdk-example``: the official SDK's ``MCPServer`` with the SDK example's
  in-memory event store (the ``simple-streamablehttp`` example's
  ``InMemoryEventStore``: uuid4 ids, one dict for every session, replay by
  timestamp within the cursor's stream name, ``""`` for an unknown id). It is
  not shipped in the ``mcp`` package, so it is written out here, behaviour for
  behaviour.
- ``fastmcp``: FastMCP 4 with its own ``EventStore`` on py-key-value's Redis
  store, under FastMCP's own per-transport session scoping.

Sessions live in the process's memory in both, so a deployment routes each
session back to its replica (sticky).
"""

# Annotations stay eager: the servers read the tools' signatures at run time.

import argparse
import time
import uuid
from collections.abc import Sequence
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventMessage, EventStore

__all__ = ["SdkExampleEventStore", "build_app", "main"]

RETRY_INTERVAL_MS = 100  # as replaystore's example server


class SdkExampleEventStore(EventStore):
    """The SDK example's ``InMemoryEventStore``, behaviour for behaviour."""

    def __init__(self) -> None:
        self.events: dict[str, tuple[str, Any, float]] = {}

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = str(uuid.uuid4())
        self.events[event_id] = (stream_id, message, time.time())
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str:
        if not last_event_id or last_event_id not in self.events:
            return ""
        stream_id, _, last_timestamp = self.events[last_event_id]
        later = sorted(
            (
                (event_id, message, ts)
                for event_id, (sid, message, ts) in self.events.items()
                if sid == stream_id and ts > last_timestamp
            ),
            key=lambda e: e[2],
        )
        for event_id, message, _ in later:
            if message is not None:  # a priming event carries no message
                await send_callback(EventMessage(message, event_id))
        return stream_id


def _sdk_app() -> Any:
    server = MCPServer("bench-sdk-example")

    @server.tool()
    async def countdown(ctx: Context, n: int, interval_ms: int = 0, close_after: int = 0) -> str:
        for i in range(n):
            await ctx.report_progress(i + 1, n, f"{n - i - 1} left")
            if close_after and i + 1 == close_after:
                await ctx.close_sse_stream()
        return f"done {n}"

    return server.streamable_http_app(
        event_store=SdkExampleEventStore(), retry_interval=RETRY_INTERVAL_MS
    )


def _fastmcp_app(url: str, prefix: str) -> Any:
    from fastmcp import Context as FastMCPContext
    from fastmcp import FastMCP
    from fastmcp.server.event_store import EventStore as FastMCPEventStore
    from key_value.aio.stores.redis import RedisStore
    from key_value.aio.wrappers.prefix_collections import PrefixCollectionsWrapper

    mcp = FastMCP("bench-fastmcp")

    @mcp.tool
    async def countdown(
        ctx: FastMCPContext, n: int, interval_ms: int = 0, close_after: int = 0
    ) -> str:
        for i in range(n):
            await ctx.report_progress(i + 1, n, f"{n - i - 1} left")
            if close_after and i + 1 == close_after:
                await ctx.close_sse_stream()
        return f"done {n}"

    storage = PrefixCollectionsWrapper(RedisStore(url=url), prefix)
    return mcp.http_app(
        event_store=FastMCPEventStore(storage=storage, max_events_per_stream=10_000),
        retry_interval=RETRY_INTERVAL_MS,
    )


def build_app(store: str, url: str = "", prefix: str = "") -> Any:
    """The ASGI app serving MCP at ``/mcp`` on ``store`` (``sdk-example`` or ``fastmcp``)."""
    if store == "sdk-example":
        return _sdk_app()
    if store == "fastmcp":
        return _fastmcp_app(url, prefix)
    raise ValueError(f"no MCP server for store {store!r}: sdk-example or fastmcp")


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m replaystore.bench.peer_server")
    parser.add_argument("store", choices=["sdk-example", "fastmcp"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--url", default="", help="the Redis of fastmcp's store")
    parser.add_argument("--prefix", default="", help="collection prefix of fastmcp's store")
    args = parser.parse_args(argv)
    app = build_app(args.store, args.url, args.prefix)
    uvicorn.run(app, host=args.host, port=args.port, log_level="error")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

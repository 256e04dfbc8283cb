"""The stores people use today, each driven the way it serves MCP, bare and on the wire.

- FastMCP 4's ``EventStore`` on its Redis key-value store (memory on
  ``memory://``), scoped per session by FastMCP's own wrapper. That wrapper
  keys a session by a random per-transport id, so only the process that
  created a session can resume it: the storm routes its reconnects stickily.
- ``mcp-persist``'s ``RedisEventStore`` behind its ``SessionScopedEventStore``
  (scoped by the real session id, so any replica can resume).
- The MCP Python SDK example's in-memory store (``InMemoryEventStore`` of the
  ``simple-streamablehttp`` example), which the SDK's docs point to; it is not
  shipped in the ``mcp`` package, so it is written out here once
  (:class:`SdkExampleEventStore`), behaviour for behaviour: uuid4 ids, one dict
  for every session, a replay that scans the dict for the cursor's stream and
  sends what has a later timestamp, ``""`` when the id is unknown. Process
  memory only: sticky.

The bare-store storm drives each through an adapter (:class:`FastMCPStore`,
:class:`McpPersistStore`, :class:`SdkExampleStore`); a peer that cannot be
imported is reported as unavailable, with the reason.

``bench storm --http`` serves them as MCP servers,
``python -m replaystore.bench.peers STORE --port P [--url redis://… --prefix P]``:
the same ``countdown`` tool as ``replaystore example-server`` (progress
notifications, the SSE stream closed after ``close_after`` of them), served the
way a user of that peer serves it today, so the HTTP storm compares stores and
not servers:

- ``sdk-example``: the official SDK's ``MCPServer`` with
  :class:`SdkExampleEventStore`;
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

from .stores import Reply, StoreSpec, is_redis_url, redis_client
from .workload import EVICTED_PREFIX, message

__all__ = [
    "FastMCPStore",
    "McpPersistStore",
    "SdkExampleEventStore",
    "SdkExampleStore",
    "build_app",
    "main",
]

_MESSAGES = 64


async def _replay(store: Any, cursor: str) -> Reply:
    """Run an SDK-style ``replay_events_after`` and collect what it sends."""
    got: list[str] = []

    async def send(event: Any) -> None:
        got.append(str(event.event_id))

    stream = await store.replay_events_after(cursor, send)
    if stream is None or stream == "":
        # The SDK has sent 200 before asking the store: the client sees an empty stream.
        return Reply(got or None, False, "returned_none")
    return Reply(got, False, "replayed")


class FastMCPStore:
    name = "fastmcp"

    def __init__(self, spec: StoreSpec) -> None:
        from fastmcp.server.event_store import EventStore
        from fastmcp.server.session_scoped_event_store import SessionScopedEventStore

        self._scope = SessionScopedEventStore
        self._client: Any = None
        if is_redis_url(spec.url):
            from key_value.aio.stores.redis import RedisStore
            from key_value.aio.wrappers.prefix_collections import PrefixCollectionsWrapper

            self._client = redis_client(spec.url, decode=True)
            storage: Any = PrefixCollectionsWrapper(RedisStore(client=self._client), spec.prefix)
            small_storage: Any = storage
        else:
            from key_value.aio.stores.memory import MemoryStore

            storage, small_storage = MemoryStore(), MemoryStore()
        self._main = EventStore(storage=storage, max_events_per_stream=spec.retention)
        self._small = EventStore(storage=small_storage, max_events_per_stream=spec.small_retention)
        self._sessions: dict[str, Any] = {}

    async def start(self) -> None:
        if self._client is not None:
            await self._client.ping()

    async def aclose(self) -> None:
        self._sessions.clear()
        if self._client is not None:
            await self._client.aclose()

    async def open(self, session: str) -> None:
        shared = self._small if session.startswith(EVICTED_PREFIX) else self._main
        # As FastMCP does: a random id per transport, not the MCP session id.
        self._sessions[session] = self._scope(shared, session_id=uuid.uuid4().hex)

    async def append(self, session: str, stream: str, i: int) -> str:
        return str(await self._sessions[session].store_event(stream, message(i % _MESSAGES)))

    async def resume(self, session: str, stream: str, cursor: str) -> Reply:
        return await _replay(self._sessions[session], cursor)

    def forge_ahead(self, cursor: str) -> str:
        return str(uuid.uuid4())


class McpPersistStore:
    name = "mcp-persist"

    def __init__(self, spec: StoreSpec) -> None:
        from mcp_persist import RedisEventStore
        from mcp_persist.session_scope import SessionScopedEventStore

        if not is_redis_url(spec.url):
            raise RuntimeError("mcp-persist's Redis store needs a redis:// URL")
        self._scope = SessionScopedEventStore
        self._client = redis_client(spec.url)
        self._main = RedisEventStore(
            self._client, key_prefix=spec.prefix, ttl=3600, max_stream_length=spec.retention
        )
        self._small = RedisEventStore(
            self._client,
            key_prefix=spec.prefix + "ev:",
            ttl=3600,
            max_stream_length=spec.small_retention,
        )

    async def start(self) -> None:
        await self._client.ping()

    async def aclose(self) -> None:
        await self._client.aclose()

    def _view(self, session: str) -> Any:
        shared = self._small if session.startswith(EVICTED_PREFIX) else self._main
        return self._scope(shared, session)

    async def open(self, session: str) -> None:
        return None

    async def append(self, session: str, stream: str, i: int) -> str:
        return str(await self._view(session).store_event(stream, message(i % _MESSAGES)))

    async def resume(self, session: str, stream: str, cursor: str) -> Reply:
        return await _replay(self._view(session), cursor)

    def forge_ahead(self, cursor: str) -> str:
        try:
            return str(int(cursor) + 1_000_000)  # a global counter: a newer replica's id
        except ValueError:
            return cursor + "0"


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
                (event_id, stored, ts)
                for event_id, (sid, stored, ts) in self.events.items()
                if sid == stream_id and ts > last_timestamp
            ),
            key=lambda e: e[2],
        )
        for event_id, stored, _ in later:
            if stored is not None:  # a priming event carries no message
                await send_callback(EventMessage(stored, event_id))
        return stream_id


class SdkExampleStore:
    """The SDK example's in-memory store (see the module docstring), driven as the SDK does.

    The store itself is :class:`SdkExampleEventStore`, the one the HTTP
    storm's servers run: one copy of its behaviour for both storms.
    """

    name = "sdk-example"

    def __init__(self, spec: StoreSpec) -> None:
        self._store = SdkExampleEventStore()

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        self._store.events.clear()

    async def open(self, session: str) -> None:
        # The SDK hands one store to every session and names streams "_GET_stream",
        # "1", ...: the session is not part of the stream name.
        return None

    async def append(self, session: str, stream: str, i: int) -> str:
        return await self._store.store_event(stream, message(i % _MESSAGES))

    async def resume(self, session: str, stream: str, cursor: str) -> Reply:
        return await _replay(self._store, cursor)

    def forge_ahead(self, cursor: str) -> str:
        return str(uuid.uuid4())


# -- the peers on the wire ---------------------------------------------------------

RETRY_INTERVAL_MS = 100  # as replaystore's example server


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

    parser = argparse.ArgumentParser(prog="python -m replaystore.bench.peers")
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

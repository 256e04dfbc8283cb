"""The stores people use today, each driven the way it serves MCP.

- FastMCP 4's ``EventStore`` on its Redis key-value store (memory on
  ``memory://``), scoped per session by FastMCP's own wrapper. That wrapper
  keys a session by a random per-transport id, so only the process that
  created a session can resume it: the storm routes its reconnects stickily.
- ``mcp-persist``'s ``RedisEventStore`` behind its ``SessionScopedEventStore``
  (scoped by the real session id, so any replica can resume).
- The MCP Python SDK example's in-memory store (``InMemoryEventStore`` of the
  ``simple-streamablehttp`` example), which the SDK's docs point to; it is not
  shipped in the ``mcp`` package, so it is written out once, in
  :mod:`.peer_server` (the HTTP storm's servers run it too), behaviour for
  behaviour: uuid4 ids, one dict for every session, a replay that scans the dict
  for the cursor's stream and sends what has a later timestamp, ``""`` when the
  id is unknown. Process memory only: sticky.

A peer that cannot be imported is reported as unavailable, with the reason.
"""

from __future__ import annotations

import uuid
from typing import Any

from .stores import Reply, StoreSpec, is_redis_url, redis_client
from .workload import EVICTED_PREFIX, message

__all__ = ["FastMCPStore", "McpPersistStore", "SdkExampleStore"]

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


class SdkExampleStore:
    """The SDK example's in-memory store (see the module docstring), driven as the SDK does.

    The store itself is :class:`.peer_server.SdkExampleEventStore`, the one
    the HTTP storm's servers run: one copy of its behaviour for both storms.
    """

    name = "sdk-example"

    def __init__(self, spec: StoreSpec) -> None:
        from .peer_server import SdkExampleEventStore

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

"""``subscriptions/listen`` across replicas: a :class:`SubscriptionBus` read from the store.

The SDK's listen streams (2026-07-28) get their events from a
``SubscriptionBus``; its own bus is in-process, so a ``tools/list_changed``
published on one replica never reaches a listener connected to another.
:class:`StoreSubscriptionBus` puts every published event in the store, in one
order, and each replica delivers to its listeners what it reads from there by
position:

- on Redis, a stream (``XADD``, trimmed to ``keep`` entries) that each replica
  reads with a blocking ``XREAD`` from the last entry it delivered (one
  pending read per replica, renewed every few seconds when nothing happens),
  so a dropped connection loses nothing: the reader continues from its
  position;
  every entry carries a counter, so a replica that fell more than ``keep``
  events behind knows it (logged and counted in ``gaps``) instead of skipping
  silently;
- in memory (``memory://NAME``), every bus of the process naming the store is
  called in publication order.

Every listener on every replica sees every event once, in the same order
(the publisher's replica included: it reads its own events back from the
store). Per-listener memory stays bounded by the SDK's listen handler.

Wiring::

    bus = StoreSubscriptionBus()
    mcp = MCPServer("demo", subscriptions=bus)
    app = streamable_http_app(mcp, buffer, subscriptions=bus)
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
from mcp.server.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from ..backends.coordination import Coordination, OnRedis, coordination_of
from ..buffer import ReplayBuffer

__all__ = ["StoreSubscriptionBus", "decode_event", "encode_event"]

logger = logging.getLogger(__name__)

#: Events kept in the Redis stream: how far a replica may fall behind.
DEFAULT_KEEP = 10_000

_PUBLISH = """
local n = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'n', n, 'e', ARGV[1])
return n
"""


def encode_event(event: ServerEvent) -> str:
    """The stored form of an event."""
    if isinstance(event, ToolsListChanged):
        return "tools"
    if isinstance(event, PromptsListChanged):
        return "prompts"
    if isinstance(event, ResourcesListChanged):
        return "resources"
    if isinstance(event, ResourceUpdated):
        return "uri:" + event.uri
    raise TypeError(f"not a server event: {event!r}")


def decode_event(text: str) -> ServerEvent | None:
    """An event from its stored form (None for one this version does not know)."""
    if text == "tools":
        return ToolsListChanged()
    if text == "prompts":
        return PromptsListChanged()
    if text == "resources":
        return ResourcesListChanged()
    if text.startswith("uri:"):
        return ResourceUpdated(uri=text[4:])
    return None


class _MemoryScope:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buses: weakref.WeakSet[StoreSubscriptionBus] = weakref.WeakSet()


_SCOPES: weakref.WeakKeyDictionary[object, _MemoryScope] = weakref.WeakKeyDictionary()
_SCOPES_LOCK = threading.Lock()


class StoreSubscriptionBus:
    """A ``SubscriptionBus`` shared by every replica of one store (see the module docstring)."""

    def __init__(self, *, keep: int = DEFAULT_KEEP, block: float | None = None) -> None:
        """``keep``: events kept in the store (how far a replica may fall behind).

        ``block``: how long one read of the Redis stream waits for new events
        before it is sent again; by default as long as the client's
        ``socket_timeout`` allows (a second less, at most a minute), so an
        idle replica costs Redis one read every few seconds.
        """
        if keep < 1 or (block is not None and not 0 < block <= 60):
            raise ValueError("keep >= 1 and 0 < block <= 60 seconds")
        self.keep = keep
        self.block = block
        self.gaps = 0  # events this replica knows it missed (fell more than keep behind)
        self._coordination: Coordination | None = None
        self._scope: _MemoryScope | None = None
        self._listeners: dict[object, Callable[[ServerEvent], None]] = {}
        self._running = False

    def bind(self, buffer: ReplayBuffer) -> None:
        """Share events through the store of ``buffer``."""
        if self._coordination is None:
            self._coordination = coordination_of(buffer.backend)

    # -- the SubscriptionBus protocol ----------------------------------------------

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        token = object()
        self._listeners[token] = listener

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe

    async def publish(self, event: ServerEvent) -> None:
        text = encode_event(event)
        coordination = self._coordination
        if coordination is None:
            raise RuntimeError("StoreSubscriptionBus has no store: pass it to streamable_http_app")
        if isinstance(coordination, OnRedis):
            keys = self._keys(coordination)
            try:
                await coordination.client.eval(_PUBLISH, 2, *keys, text, self.keep)
            except Exception as exc:  # redis.RedisError and cluster errors alike
                from ..backends.redis.client import storage_error

                raise storage_error("publishing a listen event", exc) from exc
            return
        scope = self._memory_scope(coordination.scope)
        with scope.lock:
            buses = list(scope.buses)
        for bus in buses:
            bus._deliver(event)
        await anyio.lowlevel.checkpoint()

    # -- delivery --------------------------------------------------------------------

    def _deliver(self, event: ServerEvent) -> None:
        for listener in list(self._listeners.values()):
            try:
                listener(event)
            except Exception:  # one bad listener must not starve the others
                logger.exception("subscription listener raised; continuing")

    @staticmethod
    def _keys(coordination: OnRedis) -> list[str]:
        # Here, not at the top: an app on a memory store never imports redis-py.
        from ..backends.redis.keys import listen

        return list(listen(coordination.key_base))

    def _memory_scope(self, key: object) -> _MemoryScope:
        if self._scope is None:
            with _SCOPES_LOCK:
                scope = _SCOPES.get(key)
                if scope is None:
                    scope = _SCOPES[key] = _MemoryScope()
            self._scope = scope
        return self._scope

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Deliver events from the store to this replica's listeners while open."""
        coordination = self._coordination
        if coordination is None:
            raise RuntimeError("StoreSubscriptionBus has no store: pass it to streamable_http_app")
        if not isinstance(coordination, OnRedis):
            scope = self._memory_scope(coordination.scope)
            with scope.lock:
                scope.buses.add(self)
            try:
                yield
            finally:
                with scope.lock:
                    scope.buses.discard(self)
            return
        async with anyio.create_task_group() as group:
            start = await self._tip(coordination)
            group.start_soon(self._read, coordination, start)
            try:
                yield
            finally:
                group.cancel_scope.cancel()

    async def _tip(self, coordination: OnRedis) -> tuple[str, int]:
        """Where this replica starts reading: after the newest stored event."""
        key, counter = self._keys(coordination)
        try:
            newest = await coordination.client.xrevrange(key, count=1)
            count = await coordination.client.get(counter)
        except Exception as exc:
            logger.warning("listen events: cannot read the stream's end: %s", exc)
            return "$", -1
        last = _text(newest[0][0]) if newest else "0-0"
        return last, int(count) if count is not None and newest else -1

    async def _read(self, coordination: OnRedis, start: tuple[str, int]) -> None:
        key = self._keys(coordination)[0]
        last, seen = start
        block_ms = int((self.block or _longest_wait(coordination.client)) * 1000)
        while True:
            try:
                reply = await coordination.client.xread({key: last}, count=500, block=block_ms)
            except Exception as exc:  # connection lost: retry from the same position
                logger.warning("listen events: read failed, retrying: %s", exc)
                await anyio.sleep(0.5)
                continue
            for _stream, entries in reply or ():
                for entry_id, fields in entries:
                    last = _text(entry_id)
                    values = {_text(k): _text(v) for k, v in fields.items()}
                    number = int(values.get("n", "0"))
                    if seen >= 0 and number > seen + 1:
                        self.gaps += number - seen - 1
                        logger.warning(
                            "listen events: %d event(s) trimmed before this replica read them",
                            number - seen - 1,
                        )
                    seen = number
                    event = decode_event(values.get("e", ""))
                    if event is not None:
                        self._deliver(event)
            await anyio.lowlevel.checkpoint()


def _longest_wait(client: Any) -> float:
    """How long a blocking read may wait on ``client``: its reply timeout, less a second."""
    try:
        timeout = client.get_connection_kwargs().get("socket_timeout")
    except Exception:  # a client without redis-py's connection settings
        timeout = None
    if timeout is None:
        return 60.0
    return max(0.1, min(60.0, float(timeout) - 1.0))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

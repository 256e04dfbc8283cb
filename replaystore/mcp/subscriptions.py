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
  silently, and ends every listen stream it serves with an error naming the
  loss (:class:`EndsOnGap`): its client listens again and lists again,
  instead of reading the silence as "nothing changed";
- in memory (``memory://NAME``), every bus of the process naming the store is
  called in publication order.

Where the events are kept is the store's backend's to say
(:meth:`~replaystore.backends.coordination.Coordination.listen_events`); this
bus encodes events, reads them back and hands them to its listeners.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, SubscriptionsListenRequestParams

from ..backends.coordination import Coordination, EventLog, coordination_of
from ..buffer import ReplayBuffer

__all__ = ["EVENTS_LOST", "EndsOnGap", "StoreSubscriptionBus", "decode_event", "encode_event"]

logger = logging.getLogger(__name__)

#: Events kept in the Redis stream: how far a replica may fall behind.
DEFAULT_KEEP = 10_000

#: The ``data.reason`` of the error ending a listen stream whose replica missed events.
EVENTS_LOST = "events_lost"


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
        self._events: EventLog | None = None
        self._listeners: dict[object, Callable[[ServerEvent], None]] = {}
        self._losers: dict[object, Callable[[int], None]] = {}
        self._told = 0  # the gaps the listeners were told of
        self._running = False

    def bind(self, buffer: ReplayBuffer) -> None:
        """Share events through the store of ``buffer``."""
        if self._events is None:
            self.keep_in(coordination_of(buffer.backend))

    def keep_in(self, coordination: Coordination) -> None:
        """Share events through ``coordination``'s event log (the store's), unless already bound."""
        if self._events is None:
            self._events = coordination.listen_events(keep=self.keep, block=self.block)

    @property
    def listeners(self) -> int:
        """Listen streams open on this replica (each subscribes once)."""
        return len(self._listeners)

    @property
    def gaps(self) -> int:
        """Events this replica knows it missed (it fell more than ``keep`` behind)."""
        return self._events.gaps if self._events is not None else 0

    # -- the SubscriptionBus protocol ----------------------------------------------

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        token = object()
        self._listeners[token] = listener

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe

    def on_gap(self, missed: Callable[[int], None]) -> Callable[[], None]:
        """Call ``missed(count)`` whenever this replica finds it missed events; the undo."""
        token = object()
        self._losers[token] = missed

        def forget() -> None:
            self._losers.pop(token, None)

        return forget

    async def publish(self, event: ServerEvent) -> None:
        text = encode_event(event)
        await self._log().publish(text)

    # -- delivery --------------------------------------------------------------------

    def _deliver(self, event: ServerEvent) -> None:
        for listener in list(self._listeners.values()):
            try:
                listener(event)
            except Exception:  # one bad listener must not starve the others
                logger.exception("subscription listener raised; continuing")

    def _deliver_text(self, text: str) -> None:
        # The log counts a gap as it reads the first event after it: told before that event.
        gaps = self.gaps
        if gaps > self._told:
            missed, self._told = gaps - self._told, gaps
            for lost in list(self._losers.values()):
                lost(missed)
        event = decode_event(text)
        if event is not None:
            self._deliver(event)

    def _log(self) -> EventLog:
        log = self._events
        if log is None:
            raise RuntimeError("StoreSubscriptionBus has no store: pass it to streamable_http_app")
        return log

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Deliver events from the store to this replica's listeners while open."""
        async with self._log().reading(self._deliver_text):
            yield


#: A ``subscriptions/listen`` handler (the SDK's, or one serving more kinds).
ListenHandlerFn = Callable[
    [ServerRequestContext[Any, Any], SubscriptionsListenRequestParams], Awaitable[Any]
]


class EndsOnGap:
    """A listen handler whose stream ends with an error once its replica missed events.

    ``subscriptions/listen`` is best-effort, but a listener must not take
    silence for "nothing changed" when the server knows otherwise: a replica
    whose reader fell further behind than the store keeps (the events it
    missed are counted in :attr:`StoreSubscriptionBus.gaps` and logged) ends
    every stream it serves with a JSON-RPC error (-32603, ``data.reason``
    :data:`EVENTS_LOST`, ``data.missed``), and the client listens again and
    lists what it follows. Streams end only through ``handler`` otherwise.
    """

    def __init__(self, handler: ListenHandlerFn, bus: StoreSubscriptionBus) -> None:
        self._handler = handler
        self._bus = bus

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> Any:
        lost = 0
        gap = anyio.Event()
        answer: list[Any] = []
        failed: list[BaseException] = []

        def missed(count: int) -> None:
            nonlocal lost
            lost += count
            gap.set()

        async def serve(scope: anyio.CancelScope) -> None:
            try:
                answer.append(await self._handler(ctx, params))
            except Exception as exc:  # raised as is below, not in an exception group
                failed.append(exc)
            scope.cancel()

        forget = self._bus.on_gap(missed)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(serve, group.cancel_scope)
                await gap.wait()
                group.cancel_scope.cancel()
        finally:
            forget()
        if failed:
            raise failed[0]
        if answer:
            return answer[0]
        raise MCPError(
            INTERNAL_ERROR,
            f"this replica missed {lost} listen event(s): it fell further behind than the "
            "store keeps; listen again and list what you follow",
            {"reason": EVENTS_LOST, "missed": lost},
        )

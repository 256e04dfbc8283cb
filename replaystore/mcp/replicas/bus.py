"""Notifications between replicas: wake-ups, session ends, takeovers, forwarded client messages.

Payloads never travel here, only hints: an event's data is always read from
the store, so a lost notification costs latency (a periodic position check
catches it), never data. Each replica holds **one** subscription connection,
whatever the number of attached clients:

- a *session channel* per session that has live connections on this replica
  (subscribed while the first one attaches, dropped with the last): "stream
  X of session S has new events";
- one *broadcast channel*: "session S ended", "stream X of S was taken over";
- one *replica channel* per replica: client messages forwarded to the replica
  running the request they belong to.

On Redis this is classic pub/sub on one dedicated connection (on a cluster,
``PUBLISH`` reaches subscribers on every node); wake-ups are coalesced and
published by one background task, so an append never waits for them. On
``memory://NAME`` the replicas of one process call each other directly.
Which of the two a store gets is what its backend declares
(:mod:`replaystore.backends.coordination`). Messages are typed values
(:class:`Wake`, :class:`End`, :class:`Takeover`, :class:`Forward`), put on
the wire and read back in one place (:func:`encode`, :func:`decode`).
"""

from __future__ import annotations

import json
import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import anyio.abc

from ...backends.coordination import Coordination, OnRedis

__all__ = [
    "Bus",
    "End",
    "Forward",
    "Gap",
    "MemoryBus",
    "Message",
    "RedisBus",
    "Takeover",
    "Wake",
    "bus_for",
    "decode",
    "encode",
]

logger = logging.getLogger("replaystore.mcp")


@dataclass(frozen=True, slots=True)
class Wake:
    """``stream`` of ``session`` has new events (read them from the store)."""

    session: str
    stream: str


@dataclass(frozen=True, slots=True)
class End:
    """``session`` ended (DELETE, failed verdict): forget it and close its connections."""

    session: str


@dataclass(frozen=True, slots=True)
class Takeover:
    """A newer connection took ``stream`` of ``session`` over: close the one carrying it here."""

    session: str
    stream: str


@dataclass(frozen=True, slots=True)
class Forward:
    """A client message (JSON text) for a request of ``session`` running where it is sent."""

    session: str
    body: str


@dataclass(frozen=True, slots=True)
class Gap:
    """Notifications may have been lost (the subscription dropped): every live connection re-reads.

    Raised locally by a bus that reconnects; never sent.
    """


Message = Wake | End | Takeover | Forward | Gap

Handler = Callable[[Message], None]


def encode(message: Message, sender: str) -> str:
    """The wire form of a message: one JSON object, the same for every bus and every replica."""
    match message:
        case Wake(session, stream):
            fields = {"t": "wake", "s": session, "q": stream}
        case End(session):
            fields = {"t": "end", "s": session}
        case Takeover(session, stream):
            fields = {"t": "takeover", "s": session, "q": stream}
        case Forward(session, body):
            fields = {"t": "fwd", "s": session, "m": body}
        case Gap():
            raise ValueError("a gap is noticed locally, never sent")
    return json.dumps({**fields, "from": sender})


def decode(text: str | bytes) -> tuple[Message, str] | None:
    """A message and its sender from the wire, or None for anything malformed or unknown.

    Tolerant: a notification is a hint, so one that cannot be read is dropped
    (the periodic store checks catch up), never an error.
    """
    try:
        fields = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(fields, dict):
        return None
    kind, session, sender = fields.get("t"), fields.get("s"), fields.get("from")
    if not isinstance(session, str):
        return None
    sender = sender if isinstance(sender, str) else ""
    stream, body = fields.get("q"), fields.get("m")
    if kind == "wake" and isinstance(stream, str):
        return Wake(session, stream), sender
    if kind == "end":
        return End(session), sender
    if kind == "takeover" and isinstance(stream, str):
        return Takeover(session, stream), sender
    if kind == "fwd" and isinstance(body, str):
        return Forward(session, body), sender
    return None


class Bus(ABC):
    """One replica's end of the notification channels."""

    def __init__(self, replica: str, handler: Handler) -> None:
        self.replica = replica
        self._handler = handler
        self._watching: dict[str, int] = {}

    @abstractmethod
    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Listen (and publish) until cancelled; ``task_status.started()`` once subscribed."""

    async def watch(self, session: str) -> None:
        """Receive the wake-ups of ``session`` (counted: one call per live connection)."""
        count = self._watching.get(session, 0)
        self._watching[session] = count + 1
        if count == 0:
            await self._subscribe(session)

    async def unwatch(self, session: str) -> None:
        count = self._watching.get(session, 0) - 1
        if count > 0:
            self._watching[session] = count
            return
        self._watching.pop(session, None)
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await self._unsubscribe(session)

    @abstractmethod
    def wake(self, session: str, stream: str) -> None:
        """Tell the other replicas that ``stream`` of ``session`` has new events (never blocks)."""

    @abstractmethod
    async def broadcast(self, message: Message) -> None:
        """Send a control message to every replica."""

    @abstractmethod
    async def send(self, replica: str, message: Message) -> None:
        """Send a message to one replica."""

    @abstractmethod
    async def _subscribe(self, session: str) -> None: ...

    @abstractmethod
    async def _unsubscribe(self, session: str) -> None: ...

    def _deliver(self, message: Message, sender: str) -> None:
        if sender == self.replica:
            return  # our own publication, already handled locally
        try:
            self._handler(message)
        except Exception:
            logger.exception("handling a replica notification failed")


# ---------------------------------------------------------------- memory


class _Group:
    def __init__(self) -> None:
        self.members: weakref.WeakSet[MemoryBus] = weakref.WeakSet()


_GROUPS: weakref.WeakKeyDictionary[object, _Group] = weakref.WeakKeyDictionary()


class MemoryBus(Bus):
    """The replicas of one process sharing a memory store."""

    def __init__(self, replica: str, handler: Handler, key: object) -> None:
        super().__init__(replica, handler)
        group = _GROUPS.get(key)
        if group is None:
            group = _GROUPS[key] = _Group()
        self._group = group

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._group.members.add(self)
        try:
            task_status.started()
            await anyio.sleep_forever()
        finally:
            self._group.members.discard(self)

    async def _subscribe(self, session: str) -> None:
        pass

    async def _unsubscribe(self, session: str) -> None:
        pass

    def wake(self, session: str, stream: str) -> None:
        message = Wake(session, stream)
        for member in list(self._group.members):
            if member is not self and session in member._watching:
                member._deliver(message, self.replica)

    async def broadcast(self, message: Message) -> None:
        for member in list(self._group.members):
            if member is not self:
                member._deliver(message, self.replica)

    async def send(self, replica: str, message: Message) -> None:
        for member in list(self._group.members):
            if member.replica == replica:
                member._deliver(message, self.replica)


# ---------------------------------------------------------------- redis


class RedisBus(Bus):
    """Classic pub/sub on one dedicated connection per replica."""

    def __init__(self, replica: str, handler: Handler, redis: OnRedis) -> None:
        # Here, not at the top: an app on a memory store never imports redis-py.
        from ...backends.redis.keys import all_channel, replica_channel, session_channel

        super().__init__(replica, handler)
        self._client = redis.client
        self._session_channel = partial(session_channel, redis.prefix)
        self._replica_channel = partial(replica_channel, redis.prefix)
        self._all = all_channel(redis.prefix)
        self._mine = self._replica_channel(replica)
        self._pubsub: Any = None  # redis-py's PubSub (untyped)
        self._pending: dict[tuple[str, str], None] = {}
        self._kick = anyio.Event()
        self._confirmed: dict[str, anyio.Event] = {}

    def _channel(self, session: str) -> str:
        return self._session_channel(session)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._pubsub = self._client.pubsub()
        try:
            try:
                await self._pubsub.subscribe(self._all, self._mine)
            except Exception as exc:
                raise _said("subscribing to the replicas' channels", exc) from exc
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._publisher)
                task_status.started()
                await self._listen()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                try:
                    await self._pubsub.aclose()
                except Exception:
                    logger.debug("closing the notification connection failed", exc_info=True)

    async def _listen(self) -> None:
        while True:
            try:
                raw = await self._pubsub.get_message(ignore_subscribe_messages=False, timeout=1.0)
            except Exception as exc:
                logger.warning("replica notifications interrupted (%s); reconnecting", exc)
                # A subscription sent meanwhile gets no confirmation (Redis may
                # have refused it: busy, loading): whoever waits for one reads
                # the store now, and hears what the store says.
                for confirmed in self._confirmed.values():
                    confirmed.set()
                self._confirmed.clear()
                await anyio.sleep(0.5)
                self._handler(Gap())  # what was published meanwhile is lost
                continue
            if raw is None:
                continue
            kind = raw.get("type")
            channel = raw.get("channel")
            channel = channel.decode() if isinstance(channel, bytes) else str(channel)
            if kind == "subscribe":
                event = self._confirmed.pop(channel, None)
                if event is not None:
                    event.set()
                continue
            if kind != "message":
                continue
            decoded = decode(raw.get("data", b""))
            if decoded is not None:
                self._deliver(*decoded)

    async def _publisher(self) -> None:
        while True:
            await self._kick.wait()
            self._kick = anyio.Event()
            batch, self._pending = list(self._pending), {}
            for session, stream in batch:
                message = encode(Wake(session, stream), self.replica)
                try:
                    await self._client.publish(self._channel(session), message)
                except Exception as exc:
                    # A lost wake-up costs latency only: tails re-check the store periodically.
                    logger.debug("wake-up of session %s not published: %s", session, exc)

    async def _subscribe(self, session: str) -> None:
        if self._pubsub is None:
            return
        channel = self._channel(session)
        confirmed = self._confirmed[channel] = anyio.Event()
        try:
            await self._pubsub.subscribe(channel)
        except Exception as exc:
            logger.debug("%s", _said(f"subscribing to session {session}", exc))
            return
        # Subscribe first, then read the store: wait (briefly) for the
        # subscription to be active so no wake-up falls in between.
        with anyio.move_on_after(1.0):
            await confirmed.wait()

    async def _unsubscribe(self, session: str) -> None:
        if self._pubsub is None:
            return
        try:
            await self._pubsub.unsubscribe(self._channel(session))
        except Exception as exc:
            logger.debug("unsubscribing from session %s failed: %s", session, exc)

    def wake(self, session: str, stream: str) -> None:
        self._pending[(session, stream)] = None
        self._kick.set()

    async def broadcast(self, message: Message) -> None:
        await self._publish(self._all, message)

    async def send(self, replica: str, message: Message) -> None:
        await self._publish(self._replica_channel(replica), message)

    async def _publish(self, channel: str, message: Message) -> None:
        text = encode(message, self.replica)
        try:
            await self._client.publish(channel, text)
        except Exception as exc:
            logger.warning("could not notify the other replicas: %s", _said("publishing", exc))


def bus_for(coordination: Coordination, replica: str, handler: Handler) -> Bus:
    """The notification channels a backend's coordination declares."""
    if isinstance(coordination, OnRedis):
        return RedisBus(replica, handler, coordination)
    return MemoryBus(replica, handler, coordination.scope)


def _said(what: str, exc: BaseException) -> Exception:
    """What Redis said about a notification, as every Redis-backed part of the package says it."""
    from ...backends.redis.client import storage_error

    return storage_error(what, exc)

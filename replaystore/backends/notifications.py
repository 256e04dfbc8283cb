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

A backend's coordination builds each replica's end
(:meth:`~replaystore.backends.coordination.Coordination.bus`): on Redis,
classic pub/sub on one dedicated connection
(:mod:`replaystore.backends.redis.coordination.bus`); on ``memory://NAME``
the replicas of one process call each other directly
(:mod:`replaystore.backends.memory.bus`). Messages are typed values
(:class:`Wake`, :class:`End`, :class:`Takeover`, :class:`Forward`), put on
the wire and read back in one place (:func:`encode`, :func:`decode`).
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

__all__ = [
    "Bus",
    "End",
    "Forward",
    "Gap",
    "Handler",
    "Message",
    "Takeover",
    "Wake",
    "decode",
    "encode",
    "hint",
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
        hint(self._handler, message, about="handling a replica notification")


def hint(callback: Callable[..., None], *args: Any, about: str) -> None:
    """Call ``callback(*args)``, a hint to the layer above (a notification's handler, a task's
    nudge or wake-up), from a loop or a store operation that must go on whatever it does.

    Whoever hears a hint reads the store anyway (on a timer, at the next beat), so a callback
    that raises costs latency, never data. Its error is a bug of the callback's, not of the
    store: its traceback is logged, once, under ``about``.
    """
    try:
        callback(*args)
    except Exception:  # the one catch-all of the backends' callbacks: see the docstring
        logger.exception("%s failed", about)

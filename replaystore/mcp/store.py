"""The MCP SDK's ``EventStore``, backed by a :class:`~replaystore.ReplayBuffer`.

Why two classes: the SDK hands *one* event store object to every session and
names streams ``_GET_stream``, ``"1"``, ``"2"`` … in every session alike, so a
store that only sees ``store_event(stream_id, message)`` cannot tell sessions
apart. :class:`ReplayEventStore` is the shared object the application creates;
:class:`SessionEventStore` is a view bound to one real ``Mcp-Session-Id``,
handed to that session's transport when the session is admitted (see
:mod:`replaystore.mcp.transport`). In the buffer, the session id is the real
``Mcp-Session-Id`` and each SDK stream is a sequence of that session, so event
ids are replaystore cursors and any replica (or an operator's tool) that
shares the storage reads the same verdict for them.

The view also owns what makes a resumption exact at the seam between replay
and live delivery. Every append of a session goes through one lock, and the
live feed of a resumed or GET connection (a :class:`Tail`) is fed from inside
that lock, so:

- the order of live events equals their position order;
- a resolve-and-replay taken under the lock is a snapshot that no append can
  straddle: every event is either in the replay or pushed to the tail that is
  registered before the lock is released, never both, never neither (tails
  still drop anything at or below the replay's last position, as a second line
  of defence);
- taking a stream over from an older connection happens under the same lock,
  so no event can reach the old connection after the new one has its replay.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.streamable_http import (
    GET_STREAM_KEY,
    EventCallback,
    EventId,
    EventMessage,
    EventStore,
    StreamId,
)
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCResponse, jsonrpc_message_adapter

from ..buffer import ReplayBuffer
from ..cursor import Cursor
from ..errors import ResumptionDesyncError, StorageError, UnknownSessionError
from ..verdicts import Event, Evidence, Resumption, Verdict
from .metrics import STORAGE_ERROR, ResumptionObserver

__all__ = [
    "GET_STREAM",
    "Attachment",
    "LiveEvent",
    "ReplayEventStore",
    "SessionEventStore",
    "Tail",
    "decode_message",
    "encode_message",
]

logger = logging.getLogger("replaystore.mcp")

#: The SDK's name for the standalone GET stream of a session.
GET_STREAM = GET_STREAM_KEY

#: Live events a connection may have queued before it is cut off. A client that
#: reads this slowly is disconnected and resumes from its last id (the events
#: are in the store), instead of stalling the session's message router.
TAIL_CAPACITY = 1024

#: Request streams remembered as finished (their response was stored), per
#: session, so that resuming one after its response ends at once.
_FINISHED_MEMORY = 4096


def encode_message(message: JSONRPCMessage) -> bytes:
    """The stored form of a message: exactly the JSON the SDK puts in an SSE ``data:`` field."""
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8")


def decode_message(payload: bytes) -> JSONRPCMessage:
    """Parse a stored payload back with the SDK's own JSON-RPC message adapter."""
    return jsonrpc_message_adapter.validate_json(payload, by_name=False)


def _is_response(message: JSONRPCMessage | None) -> bool:
    return isinstance(message, JSONRPCResponse | JSONRPCError)


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """One event appended while a connection is attached; ``message`` is None for priming."""

    position: int
    event_id: str
    message: JSONRPCMessage | None


class Tail:
    """The live feed of one stream to one connection.

    Fed with ``send_nowait`` from inside the session lock (never blocks the
    message router); the connection's writer runs inside :attr:`scope`, so
    cancelling the scope ends that connection at once (takeover, overflow,
    ``close_sse_stream``, session end).
    """

    def __init__(self, stream: str, capacity: int = TAIL_CAPACITY) -> None:
        self.stream = stream
        self._send: MemoryObjectSendStream[LiveEvent]
        self.receive: MemoryObjectReceiveStream[LiveEvent]
        self._send, self.receive = anyio.create_memory_object_stream[LiveEvent](capacity)
        self.scope = anyio.CancelScope()
        self.closed = False

    def push(self, event: LiveEvent) -> bool:
        """Queue ``event``; False (and the tail closed) if the reader is gone or too slow."""
        if self.closed:
            return False
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            logger.warning(
                "live feed of stream %r overflowed (%d events queued): closing the "
                "connection, the client resumes from its last event id",
                self.stream,
                TAIL_CAPACITY,
            )
            self.close()
            return False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.close()
            return False
        return True

    def close(self) -> None:
        """End the connection this tail feeds (idempotent, synchronous)."""
        self.closed = True
        self.scope.cancel()
        self._send.close()
        self.receive.close()


@dataclass(slots=True)
class Attachment:
    """What a connection that (re)attaches to a stream gets.

    ``replay`` holds the missed messages (priming events left out) with their
    positions; ``tail`` the live feed registered in the same locked step, or
    None when the stream is already finished (its response was replayed or
    delivered before). Live events at or below ``threshold`` were part of the
    snapshot and are skipped.
    """

    resumption: Resumption
    stream: str | None = None
    replay: list[tuple[int, EventMessage]] = field(default_factory=list)
    tail: Tail | None = None
    threshold: int = 0

    @property
    def ok(self) -> bool:
        return self.resumption.ok


class ReplayEventStore(EventStore):
    """The object an application creates: a ``ReplayBuffer`` plus an observer.

    It is an ``EventStore`` only so that it can be passed where the SDK or
    FastMCP expect one; it refuses to store or replay on its own, because it
    does not know which session a call belongs to. The session manager of
    :mod:`replaystore.mcp.transport` replaces it, per session, with
    :meth:`for_session`. Using it with a stock manager fails loudly (HTTP 500 on
    the first request) instead of mixing sessions.
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        *,
        observer: ResumptionObserver | None = None,
        tail_capacity: int = TAIL_CAPACITY,
    ) -> None:
        self.buffer = buffer
        self.observer = observer
        self.tail_capacity = tail_capacity
        # Closing sessions is housekeeping; at shutdown every session closes at
        # once, which must not exhaust the storage client's connection pool.
        self.close_limiter = anyio.CapacityLimiter(8)

    def for_session(self, session_id: str) -> SessionEventStore:
        """A view bound to one real ``Mcp-Session-Id``."""
        return SessionEventStore(self, session_id)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        raise RuntimeError(_UNBOUND)

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        raise RuntimeError(_UNBOUND)


_UNBOUND = (
    "ReplayEventStore is not bound to a session: serve it through "
    "replaystore.mcp.streamable_http_app / ReplaySessionManager / fastmcp_http_app, "
    "which give each session a SessionEventStore keyed by its real Mcp-Session-Id"
)


class SessionEventStore(EventStore):
    """The event store of one MCP session: its SDK streams are sequences of one buffer session.

    Usable on its own as a plain SDK ``EventStore`` (``store_event`` /
    ``replay_events_after``), but the HTTP guarantees (404 on a failed
    resumption, an exact replay-to-live seam, GET events kept while no GET is
    attached) come from :class:`~replaystore.mcp.transport.ReplayTransport`,
    which uses :meth:`attach_resume` and :meth:`attach_get`.
    """

    def __init__(self, parent: ReplayEventStore, session_id: str) -> None:
        self.parent = parent
        self.buffer = parent.buffer
        self.session_id = session_id
        self._lock = anyio.Lock()
        self._opened = False
        self._dead = False  # torn down (failed verdict) or closed: no more appends
        self._closed = False  # close() ran
        self._tails: dict[str, Tail] = {}
        self._finished: dict[str, None] = {}
        # The standalone GET stream: the id (and position) of the last event of
        # it handed to a GET connection, or of an anchor stored before the
        # first GET event; and the position of the last GET message stored.
        self._get_mark: str | None = None
        self._get_mark_position = 0
        self._get_last_message_position = 0
        #: Called (synchronously) when an append fails: the session can no
        #: longer prove continuity, so the manager tears it down.
        self.on_failure: Callable[[BaseException], None] | None = None
        #: Set by the session manager: forget the session in this process
        #: (its id answers 404 from then on) and close it in the store.
        self.discard: Callable[[], Awaitable[None]] | None = None

    # ------------------------------------------------------------------ SDK API

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Append one event; ``message=None`` is a priming event (a position, never replayed)."""
        payload = None if message is None else encode_message(message)
        async with self._lock:
            event_id = await self._append_locked(stream_id, payload)
            self._publish_locked(stream_id, event_id, message)
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """The SDK contract, made strict: raise instead of returning None on a failed verdict.

        The SDK turns both into an empty HTTP 200; :class:`ReplayTransport`
        never calls this (it answers 404). Kept for callers that drive the
        store directly.
        """
        attachment = await self.attach_resume(last_event_id, prime=False, live=False)
        if not attachment.ok:
            raise ResumptionDesyncError(attachment.resumption)
        for _, event in attachment.replay:
            await send_callback(event)
        return attachment.stream

    # ------------------------------------------------------- attach / detach

    async def attach_resume(
        self,
        last_event_id: str,
        *,
        prime: bool,
        sequence: str | None = None,
        on_takeover: Callable[[str], None] | None = None,
        live: bool = True,
    ) -> Attachment:
        """Resolve ``last_event_id`` and, if it resumes, register a live tail in the same step.

        With ``prime`` a priming event is appended right after the snapshot
        (so it reaches the client after the replay, in position order).
        ``on_takeover(stream)`` is called under the lock before the new tail is
        registered, for the transport to close a connection of its own that
        still carries the stream. Raises :class:`StorageError` when the verdict
        is unknown.
        """
        async with self._lock:
            return await self._resume_locked(
                last_event_id, sequence=sequence, prime=prime, on_takeover=on_takeover, live=live
            )

    async def attach_get(
        self, *, prime: bool, on_takeover: Callable[[str], None] | None = None
    ) -> Attachment:
        """Attach a plain GET (no ``Last-Event-ID``) to the standalone stream.

        If GET-stream messages were stored since the last one handed to a GET
        connection, this is a resumption from that remembered id (a failure is
        a failed resumption, like any other). Otherwise a priming event is
        stored and becomes the first event of the connection, so the client
        holds a resumable cursor at once.
        """
        async with self._lock:
            if self._get_mark is not None and (
                self._get_last_message_position > self._get_mark_position
            ):
                return await self._resume_locked(
                    self._get_mark,
                    sequence=GET_STREAM,
                    prime=prime,
                    on_takeover=on_takeover,
                    live=True,
                )
            self._take_over_locked(GET_STREAM, on_takeover)
            tail = self._register_locked(GET_STREAM)
            try:
                anchor = await self._append_locked(GET_STREAM, None)
            except UnknownSessionError:
                self._drop_tail(tail)
                return Attachment(_vanished(self.session_id))
            except BaseException:
                self._drop_tail(tail)
                raise
            self._set_get_mark(anchor)
            tail.push(LiveEvent(Cursor.parse(anchor).position, anchor, None))
            return Attachment(
                Resumption(Verdict.RESUMED, Evidence(self.session_id, "attached live")),
                stream=GET_STREAM,
                tail=tail,
                threshold=0,
            )

    def delivered(self, tail: Tail, position: int, event_id: str) -> None:
        """A connection handed event ``event_id`` to its client (tracks the GET stream)."""
        if (
            tail.stream == GET_STREAM
            and self._tails.get(GET_STREAM) is tail
            and position > self._get_mark_position
        ):
            self._set_get_mark(event_id, position)

    def detach(self, tail: Tail) -> None:
        """A connection ended: forget its tail (only if it is still the current one)."""
        tail.close()
        self._drop_tail(tail)

    def close_stream(self, stream: str) -> None:
        """End the connection currently carrying ``stream``, if it is one of ours."""
        tail = self._tails.pop(stream, None)
        if tail is not None:
            tail.close()

    def close_all_streams(self) -> None:
        for tail in list(self._tails.values()):
            tail.close()
        self._tails.clear()

    async def close(self) -> None:
        """The session ended here (DELETE, idle, teardown, shutdown): close it in the store too.

        Idempotent; shielded and bounded, since it runs while the session's
        tasks are being cancelled. Closing an already torn-down session is a
        no-op in the store (its tombstone keeps the failed verdict).
        """
        self.close_all_streams()
        if self._closed:
            return
        self._closed = self._dead = True
        if not self._opened:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
            try:
                async with self.parent.close_limiter:
                    await self.buffer.close_session(self.session_id)
            except Exception:
                logger.warning(
                    "could not close session %s in the replay store", self.session_id, exc_info=True
                )

    @property
    def is_closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------ internals

    async def _resume_locked(
        self,
        last_event_id: str,
        *,
        sequence: str | None,
        prime: bool,
        on_takeover: Callable[[str], None] | None,
        live: bool,
    ) -> Attachment:
        started = time.perf_counter()
        try:
            resumption = await self.buffer.resolve_and_replay(
                self.session_id, last_event_id, sequence
            )
        except StorageError:
            elapsed = time.perf_counter() - started
            logger.warning(
                "resumption of session %s from %r: replay store unreachable; verdict unknown",
                self.session_id,
                last_event_id[:64],
                exc_info=True,
            )
            self._observe(STORAGE_ERROR, elapsed, 0)
            raise
        elapsed = time.perf_counter() - started
        if not resumption.ok:
            self._dead = True  # the store tore the session down (or it never existed)
            logger.warning(
                "resumption failed: %s (session %s torn down); evidence=%s",
                resumption.verdict.value,
                self.session_id,
                json.dumps(resumption.evidence.as_dict(), sort_keys=True, default=str),
            )
            self._observe(resumption.verdict.value, elapsed, 0)
            return Attachment(resumption)

        stream = resumption.sequence
        assert stream is not None  # a resumed verdict always names its sequence
        replay: list[tuple[int, EventMessage]] = []
        threshold = Cursor.parse(last_event_id).position
        finished = stream in self._finished
        for event in resumption.events:
            threshold = max(threshold, event.position)
            message = _replayed_message(event)
            if message is None:
                continue
            replay.append((event.position, EventMessage(message, event.event_id)))
            if stream != GET_STREAM and _is_response(message):
                finished = True
        self._observe(resumption.verdict.value, elapsed, len(replay))
        attachment = Attachment(resumption, stream, replay, None, threshold)
        if not live:
            return attachment
        self._take_over_locked(stream, on_takeover)
        if finished:
            return attachment
        tail = self._register_locked(stream)
        attachment.tail = tail
        if prime:
            try:
                event_id = await self._append_locked(stream, None)
            except BaseException:
                self._drop_tail(tail)
                raise
            tail.push(LiveEvent(Cursor.parse(event_id).position, event_id, None))
        return attachment

    async def _append_locked(self, stream: str, payload: bytes | None) -> str:
        if self._dead:
            raise UnknownSessionError(self.session_id)
        try:
            if not self._opened:
                await self.buffer.open_session(self.session_id)
                self._opened = True
            if stream == GET_STREAM and payload is not None and self._get_mark is None:
                # The first GET message of a session stored while no GET has
                # ever attached: store an anchor just before it (same atomic
                # step), so a later plain GET can resume from it.
                anchor, event_id = await self.buffer.append_many(
                    self.session_id, stream, [None, payload]
                )
                self._set_get_mark(anchor)
            else:
                event_id = await self.buffer.append(self.session_id, stream, payload)
        except Exception as exc:
            logger.error(
                "could not store an event of session %s (stream %r): %s; "
                "tearing the session down, continuity can no longer be proven",
                self.session_id,
                stream,
                exc,
            )
            if self.on_failure is not None:
                self.on_failure(exc)
            raise
        if stream == GET_STREAM and payload is not None:
            self._get_last_message_position = Cursor.parse(event_id).position
        return event_id

    def _publish_locked(self, stream: str, event_id: str, message: JSONRPCMessage | None) -> None:
        if stream != GET_STREAM and _is_response(message):
            self._finished[stream] = None
            if len(self._finished) > _FINISHED_MEMORY:
                del self._finished[next(iter(self._finished))]
        tail = self._tails.get(stream)
        if (
            tail is not None
            and message is not None
            and not tail.push(LiveEvent(Cursor.parse(event_id).position, event_id, message))
        ):
            self._drop_tail(tail)

    def _observe(self, verdict: str, seconds: float, replayed: int) -> None:
        observer = self.parent.observer
        if observer is None:
            return
        try:
            observer.on_resumption(self.session_id, verdict, seconds, replayed)
        except Exception:  # metrics must never decide a resumption
            logger.exception("ResumptionObserver %r failed", observer)

    def _take_over_locked(self, stream: str, on_takeover: Callable[[str], None] | None) -> None:
        """The newest connection takes a stream over: end whatever carried it before."""
        if on_takeover is not None:
            on_takeover(stream)
        self.close_stream(stream)

    def _register_locked(self, stream: str) -> Tail:
        tail = Tail(stream, self.parent.tail_capacity)
        self._tails[stream] = tail
        return tail

    def _drop_tail(self, tail: Tail) -> None:
        if self._tails.get(tail.stream) is tail:
            del self._tails[tail.stream]

    def _set_get_mark(self, event_id: str, position: int | None = None) -> None:
        self._get_mark = event_id
        self._get_mark_position = Cursor.parse(event_id).position if position is None else position


def _replayed_message(event: Event) -> JSONRPCMessage | None:
    return None if event.payload is None else decode_message(event.payload)


def _vanished(session: str) -> Resumption:
    """The verdict for a session whose store entry disappeared under a live SDK session."""
    return Resumption(
        Verdict.UNKNOWN_SESSION,
        Evidence(session, "the session does not exist in the replay store"),
    )

"""The MCP SDK's ``EventStore``, backed by a :class:`~replaystore.ReplayBuffer`.

Why two classes: the SDK hands *one* event store object to every session and
names streams ``_GET_stream``, ``"1"``, ``"2"`` … in every session alike, so a
store that only sees ``store_event(stream_id, message)`` cannot tell sessions
apart. :class:`ReplayEventStore` is the shared object the application creates
(a buffer and an observer; no ``EventStore`` itself, for that reason);
:class:`SessionView` is a view of it bound to one real ``Mcp-Session-Id``,
the ``EventStore`` of that session's transport when the session is admitted or adopted
(see :mod:`replaystore.mcp.sessions.manager`). In the buffer, the session id is the
real ``Mcp-Session-Id`` and each SDK stream is a sequence of that session
(see :func:`~replaystore.mcp.sessions.messages.sequence_name`), so event ids are
replaystore cursors and every replica sharing the storage reads the same
verdict for them.

This module is the view's SDK side: appending (``store_event``), resolving
and observing verdicts, and the session's end. Live connections attach
through the view's :class:`~replaystore.mcp.sessions.live.LiveStreams`; a request
whose replica stopped is ended by :mod:`replaystore.mcp.sessions.leases`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Protocol

import anyio
from mcp.server.streamable_http import (
    EventCallback,
    EventId,
    EventMessage,
    EventStore,
    StreamId,
)
from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError, JSONRPCMessage

from ...backends.outages import OutageLog
from ...backends.session_registry import holder_field
from ...buffer import ReplayBuffer
from ...errors import StorageError, UnknownSessionError
from ...verdicts import Resumption, ResumptionDesyncError
from ..metrics import STORAGE_ERROR, ResumptionObserver, time_store
from ..refusals import note_refusal, store_trouble
from ..settings import Settings
from .live import LiveStreams
from .messages import (
    GET_STREAM,
    decode_message,
    encode_message,
    is_response,
    payloads_of,
    sequence_name,
)

if TYPE_CHECKING:
    from mcp.server.connection import Connection

    from ...verdicts import Event
    from ..replicas.replica import Replica

__all__ = ["APPENDS", "ReplayEventStore", "SessionHost", "SessionView", "as_event_store"]

logger = logging.getLogger("replaystore.mcp")
#: Appends that fail during a store outage, told in a few lines for the process.
APPENDS = OutageLog(logger, "storing events")

#: Seconds between two attempts at an append while the store is out of reach.
_RETRY_PAUSE = 0.25

#: Request streams a view remembers as answered (beyond that, the store's lease record says).
_ANSWERED_MEMORY = 4096


class SessionHost(Protocol):
    """What a view tells whoever serves its session (the session manager), given at construction."""

    def failed(self, exc: BaseException) -> None:
        """An append failed: the session can no longer prove continuity (called synchronously)."""

    async def discard(self) -> None:
        """Forget the session in this process now (it may live on elsewhere)."""

    async def refused(self, stream: str, exc: StorageError) -> bool:
        """An event of the request of ``stream`` was refused: answer it in its open stream.

        True when a connection here carries the stream and got the answer queued.
        """


class ReplayEventStore:
    """The object an application creates: a ``ReplayBuffer`` plus an observer.

    Not an SDK ``EventStore`` itself: the SDK hands one event store to every
    session and names their streams alike, so a store that does not know
    which session a call belongs to could only mix them. The session manager
    of :mod:`replaystore.mcp.sessions.manager` gives each session its own
    :class:`SessionView` (:meth:`for_session`), which is the SDK
    ``EventStore`` of that session.
    """

    def __init__(self, buffer: ReplayBuffer, *, observer: ResumptionObserver | None = None) -> None:
        self.buffer = buffer
        self.observer = observer

    def for_session(
        self,
        session_id: str,
        replica: Replica | None = None,
        host: SessionHost | None = None,
    ) -> SessionView:
        """A view bound to one real ``Mcp-Session-Id`` (served by ``replica`` for ``host``)."""
        return SessionView(self, session_id, replica, host)


def as_event_store(
    store: ReplayEventStore | ReplayBuffer, observer: ResumptionObserver | None = None
) -> ReplayEventStore:
    """Accept a buffer or an already-built store (then ``observer`` must not be given twice)."""
    if isinstance(store, ReplayEventStore):
        if observer is not None and store.observer is not observer:
            raise ValueError("pass the observer to ReplayEventStore(...), not twice")
        return store
    if isinstance(store, ReplayBuffer):
        return ReplayEventStore(store, observer=observer)
    raise TypeError(f"expected a ReplayBuffer or ReplayEventStore, not {type(store).__name__}")


class SessionView(EventStore):
    """The event store of one MCP session: its SDK streams are sequences of one buffer session.

    Usable on its own as a plain SDK ``EventStore`` (``store_event`` /
    ``replay_events_after``), but the HTTP guarantees (404 on a failed
    resumption, an exact replay-to-live seam, GET events kept while no GET is
    attached, any replica serving any stream) come from the session manager
    and :class:`~replaystore.mcp.sessions.transport.ReplayTransport`, which attach
    connections through :attr:`live`.
    """

    def __init__(
        self,
        parent: ReplayEventStore,
        session_id: str,
        replica: Replica | None = None,
        host: SessionHost | None = None,
    ) -> None:
        self.parent = parent
        self.buffer = parent.buffer
        self.session_id = session_id
        self.replica = replica
        self.host = host
        self.settings = replica.settings if replica is not None else Settings()
        #: Ended (failed verdict, DELETE) or no longer served here.
        self.closed = False
        #: Request streams answered here (bounded).
        self.answered: dict[str, None] = {}
        #: Request streams (SDK ids) answered in their open connection with
        #: the store's refusal: their later events are not stored.
        self.refused: set[str] = set()
        #: Priming events stored before the SDK starts a request's response
        #: (SDK stream id -> event id): see :meth:`prime`.
        self.primed: dict[str, str] = {}
        #: The SDK connection of this session's loop (set by the manager), for
        #: its ``initialize`` parameters; and the credential that created it.
        self.connection: Connection | None = None
        self.owner = ""
        self._opened = False
        self._recorded = False
        self._said_closed = False
        self._incarnation = ""  # drawn at the first append: a view that only reads needs none
        self._appends = 0
        self.live = LiveStreams(self)

    @property
    def opened(self) -> bool:
        """Whether the session is known to be open in the store (opened or adopted here)."""
        return self._opened

    def adopted(self, record: dict[str, str]) -> None:
        """This view serves a session another replica created (it exists in the store)."""
        self._opened = self._recorded = True
        self.live.get_mark = record.get("get") or None

    # ------------------------------------------------------------------ SDK API

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Append one event; ``message=None`` is a priming event (a position, never replayed).

        A priming event :meth:`prime` stored already is not stored again: its
        id is the one the SDK sends.
        """
        sequence = sequence_name(str(stream_id))
        primed = self.primed.pop(str(stream_id), None) if message is None else None
        if primed is not None:
            self._stored(sequence, None)
            return primed
        if self.closed or str(stream_id) in self.refused:
            # The session ended (or is no longer served here) while a tool
            # still runs: expected, not an error; said once. (Or the request
            # was answered with the store's refusal: its later events neither.)
            self._say_ended()
            return ""
        payload = None if message is None else encode_message(message)
        if payload is not None and len(payload) > self.buffer.retention.max_payload:
            payload = self._oversized(sequence, message, len(payload))
        try:
            if message is not None and is_response(message) and not self._recorded:
                await self._record()
            event_id = await self.append(sequence, payload)
        except Exception as exc:
            # Logged once by append; the manager drops the session here. Not
            # raised: the SDK's message router would die with a traceback,
            # and the request's open stream would end without its answer.
            if isinstance(exc, StorageError) and sequence != GET_STREAM:
                await self._answer_refused(str(stream_id), exc)
            return ""
        self._stored(sequence, message)
        return event_id

    def _stored(self, sequence: str, message: JSONRPCMessage | None) -> None:
        """An event of ``sequence`` is in the store: wake its readers; a response ends the lease."""
        if sequence != GET_STREAM and is_response(message):
            self.answered[sequence] = None
            if len(self.answered) > _ANSWERED_MEMORY:
                del self.answered[next(iter(self.answered))]
        if self.replica is not None:
            self.replica.wake(self.session_id, sequence)
            if sequence != GET_STREAM and is_response(message):
                self.replica.release(self.session_id, sequence)
        else:
            self.live.wake(sequence)

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """The SDK contract, made strict: raise instead of returning None on a failed verdict.

        The SDK turns both into an empty HTTP 200; :class:`ReplayTransport`
        never calls this (it answers 404). Kept for callers that drive the
        store directly.
        """
        resumption = await self.resolve(last_event_id, None)
        if not resumption.ok:
            raise ResumptionDesyncError(resumption)
        for event in resumption.events:
            message = _message(event)
            if message is not None:
                await send_callback(EventMessage(message, event.event_id))
        return resumption.sequence

    # ------------------------------------------------------------ the session's end

    def close_local(self) -> None:
        """The session is no longer served by this process (it may live on elsewhere)."""
        self.closed = True
        self.live.close_all()

    async def end_everywhere(self, *, failed: bool = False) -> None:
        """The session ended (DELETE, failed verdict): in the store and on every replica.

        Bounded and shielded: it runs while the session's tasks are cancelled.
        Closing an already torn-down session keeps its tombstone's verdict.
        ``failed``: the end of a failed verdict, which the store already
        applied in the very step that judged it (unless the buffer was built
        not to tear down on failure), so it is not closed there again.
        """
        self.close_local()
        with anyio.move_on_after(2.0, shield=True):
            try:
                if self._opened and not (failed and self.buffer.teardown_on_failure):
                    await self.buffer.close_session(self.session_id)
                if self.replica is not None:
                    held = await self.replica.registry.end_session(self.session_id)
                    await self.replica.announce_end(self.session_id, held)
            except StorageError as exc:
                logger.warning("could not end session %s in the store: %s", self.session_id, exc)

    async def discard(self) -> None:
        """Forget the session in this process (after :meth:`end_everywhere`, or on its own)."""
        if self.host is not None:
            await self.host.discard()

    # ------------------------------------------------------------ append, resolve, observe

    async def resolve(self, last_event_id: str, sequence: str | None) -> Resumption:
        """Resolve and replay in one atomic store call; log a failed verdict, observe every one."""
        started = time.perf_counter()
        try:
            resumption = await self.buffer.resolve_and_replay(
                self.session_id, last_event_id, sequence
            )
        except StorageError:
            logger.warning(
                "resumption of session %s from %r: replay store unreachable; verdict unknown",
                self.session_id,
                last_event_id[:64],
            )
            self._observe(STORAGE_ERROR, time.perf_counter() - started, 0)
            time_store("resume", time.perf_counter() - started)
            raise
        elapsed = time.perf_counter() - started
        time_store("resume", elapsed)
        if not resumption.ok:
            if logger.isEnabledFor(logging.WARNING):  # the evidence is dumped only to be logged
                logger.warning(
                    "resumption failed: %s (session %s torn down); evidence=%s",
                    resumption.verdict.value,
                    self.session_id,
                    json.dumps(resumption.evidence.as_dict(), sort_keys=True, default=str)[:2048],
                )
            self._observe(resumption.verdict.value, elapsed, 0)
        else:
            payloads = payloads_of(resumption.events)
            replayed = len(payloads) - payloads.count(None)  # priming events are not replayed
            self._observe(resumption.verdict.value, elapsed, replayed)
        return resumption

    async def open(self) -> None:
        """Open the session in the store now (raises :class:`StorageError` when it is out of reach).

        Called before ``initialize`` is answered, so that a store outage is a
        503 the client can retry instead of a 200 whose stream is then cut.
        """
        if not self._opened:
            await self.buffer.open_session(self.session_id)
            self._opened = True

    async def prime(self, stream_id: str) -> None:
        """Store the priming event of a request before the SDK starts its response (status 200).

        The SDK stores it once its response is under way, through
        :meth:`store_event`: a store refusing that write would leave a 200
        that ends without its answer. Stored here first, a refusal is a
        ``503`` the client retries (raises :class:`StorageError`, or
        :class:`UnknownSessionError` for a session ended meanwhile), and the
        session is kept: nothing of the request was sent or run. The SDK's
        own store of it then sends the id stored here (:meth:`store_event`)
        without a second write, which the store could refuse once the 200 is
        under way; the events on the wire are the ones it would have sent.
        """
        self.primed[stream_id] = await self._store(sequence_name(stream_id), None)

    async def append(self, sequence: str, payload: bytes | None) -> str:
        """Store one event (``None``: a priming event); a failure drops the session here."""
        try:
            return await self._store(sequence, payload)
        except UnknownSessionError:
            raise
        except Exception as exc:
            self._give_up(sequence, exc)
            raise

    async def _store(self, sequence: str, payload: bytes | None) -> str:
        """Store one event, waiting out a short outage.

        A store that is out of reach is waited for, up to half a lease (the
        lease outlives the wait, so no other replica takes the request for
        lost), retrying with the same idempotency key: a short outage holds
        the tool for a moment instead of ending its request.
        """
        if self.closed:
            raise UnknownSessionError(self.session_id)
        key = self._key()
        deadline: float | None = None
        while True:
            started = time.perf_counter()
            try:
                event_id = await self._append_once(sequence, payload, key)
            except UnknownSessionError:
                self._say_ended()
                self._failed(UnknownSessionError(self.session_id))
                raise
            except StorageError as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.settings.lease_ttl / 2
                wait = self.settings.lease_ttl / 2
                time_store("append", time.perf_counter() - started)
                APPENDS.failed(f"{store_trouble(exc)}; a stream waits up to {wait:g} s")
                note_refusal(exc)  # told to a client whose request cannot wait that long
                if self.closed:  # dropped here meanwhile: nothing to say twice
                    raise UnknownSessionError(self.session_id) from exc
                if now < deadline and not exc.permanent:  # the ACL: no outage to wait out
                    await anyio.sleep(min(_RETRY_PAUSE, deadline - now))
                    continue
                raise
            time_store("append", time.perf_counter() - started)
            if APPENDS.failing:
                APPENDS.succeeded()
            if deadline is not None and self.replica is not None:
                self.replica.renew_soon()
            return event_id

    async def _append_once(self, sequence: str, payload: bytes | None, key: str) -> str:
        if not self._opened:
            await self.buffer.open_session(self.session_id)
            self._opened = True
        if sequence == GET_STREAM and payload is not None and self.live.get_mark is None:
            # A view without a session record (used on its own): store an
            # anchor just before the first GET message (one atomic step),
            # so that a later plain GET can resume from it.
            anchor, event_id = await self.buffer.append_many(
                self.session_id, sequence, [None, payload], idempotency_key=key
            )
            self.live.get_mark = anchor
            return event_id
        return await self.buffer.append(self.session_id, sequence, payload, idempotency_key=key)

    async def _answer_refused(self, stream: str, exc: StorageError) -> None:
        """The request of ``stream`` gets the refusal as its answer, in its open connection."""
        if self.host is not None and stream not in self.refused:
            self.refused.add(stream)
            if not await self.host.refused(stream, exc):
                self.refused.discard(stream)

    def _give_up(self, sequence: str, exc: Exception) -> None:
        # A store that failed or refused keeps the session: the event was
        # neither stored nor sent, so what the store holds is still whole and
        # the next request adopts it; only this process lets go of it.
        outcome = (
            "its request ends with the store's error; the session stays in the store "
            "and is served again from there"
            if isinstance(exc, StorageError)
            else "the session is dropped here, continuity can no longer be proven"
        )
        logger.error(
            "could not store an event of session %s (stream %r): %s; %s",
            self.session_id,
            sequence[:64],
            str(exc)[:512],
            outcome,
        )
        self._failed(exc)

    def _oversized(self, sequence: str, message: JSONRPCMessage | None, size: int) -> bytes | None:
        """A message above the store's payload limit: answer its request with an error instead.

        Storing it is impossible and dropping a response silently would leave
        the request without an answer; tearing the session down for one large
        result would punish every later request. A response becomes a JSON-RPC
        error for the same id; anything else is replaced by a priming event
        (the position is kept, the message is not replayed).
        """
        limit = self.buffer.retention.max_payload
        logger.warning(
            "message of %d bytes on stream %r of session %s is above the store's "
            "max_payload (%d bytes): %s",
            size,
            sequence[:64],
            self.session_id,
            limit,
            "answering its request with an error" if is_response(message) else "not stored",
        )
        if not is_response(message):
            return None
        error = ErrorData(
            code=INTERNAL_ERROR,
            message=f"the result ({size} bytes) is above the server's message size limit "
            f"({limit} bytes)",
        )
        payload = encode_message(JSONRPCError(jsonrpc="2.0", id=message.id, error=error))
        if len(payload) > limit:  # the request id alone is too large to echo
            payload = encode_message(JSONRPCError(jsonrpc="2.0", id=None, error=error))
        return payload

    def _say_ended(self) -> None:
        """Once per session: a request still ran when its session ended (expected, not an error)."""
        if not self._said_closed:
            self._said_closed = True
            logger.info(
                "session %s ended while a request still ran; its later events are not stored",
                self.session_id,
            )

    def _key(self) -> str:
        """A key unique to this append: the store retries a lost reply without storing twice."""
        if not self._incarnation:
            self._incarnation = uuid.uuid4().hex[:12]
        self._appends += 1
        return f"{self._incarnation}.{self._appends}"

    def _failed(self, exc: BaseException) -> None:
        if self.host is not None:
            self.host.failed(exc)

    async def _record(self) -> None:
        """Write the session record the first time ``initialize`` is answered.

        Before the response is stored, hence before the client can send its
        next request to another replica. Also stores the GET stream's anchor,
        so a plain GET on any replica can resume messages sent before it.
        """
        connection = self.connection
        if self.replica is None or connection is None or connection.client_params is None:
            return
        self._recorded = True
        anchor = await self.append(GET_STREAM, None)
        self.live.get_mark = anchor
        fields = {
            "version": connection.protocol_version,
            "client": connection.client_params.model_dump_json(by_alias=True, exclude_none=True),
            "owner": self.owner,
            "get": anchor,
            holder_field(self.replica.id): "1",
        }
        try:
            await self.replica.registry.put_session(
                self.session_id, fields, self.buffer.retention.session_ttl
            )
        except StorageError as exc:
            logger.error(
                "could not record session %s in the store (%s); it is dropped here",
                self.session_id,
                str(exc)[:512],
            )
            self._failed(exc)
            raise

    def _observe(self, verdict: str, seconds: float, replayed: int) -> None:
        observer = self.parent.observer
        if observer is None:
            return
        try:
            observer.on_resumption(self.session_id, verdict, seconds, replayed)
        except Exception:  # metrics must never decide a resumption
            logger.exception("ResumptionObserver %r failed", observer)


def _message(event: Event) -> JSONRPCMessage | None:
    return None if event.payload is None else decode_message(event.payload)

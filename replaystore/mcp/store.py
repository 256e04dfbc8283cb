"""The MCP SDK's ``EventStore``, backed by a :class:`~replaystore.ReplayBuffer`.

Why two classes: the SDK hands *one* event store object to every session and
names streams ``_GET_stream``, ``"1"``, ``"2"`` … in every session alike, so a
store that only sees ``store_event(stream_id, message)`` cannot tell sessions
apart. :class:`ReplayEventStore` is the shared object the application creates;
:class:`SessionEventStore` is a view bound to one real ``Mcp-Session-Id``,
handed to that session's transport when the session is admitted or adopted
(see :mod:`replaystore.mcp.manager`). In the buffer, the session id is the
real ``Mcp-Session-Id`` and each SDK stream is a sequence of that session
(see :func:`~replaystore.mcp.messages.sequence_name`), so event ids are
replaystore cursors and every replica sharing the storage reads the same
verdict for them.

The view also attaches resuming and GET connections: it resolves and replays
in one atomic store call and registers a :class:`~replaystore.mcp.tail.Tail`
that reads everything after the replay from the store, whichever replica
appended it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
from mcp.server.streamable_http import (
    EventCallback,
    EventId,
    EventMessage,
    EventStore,
    StreamId,
)
from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError, JSONRPCMessage

from ..buffer import ReplayBuffer
from ..cursor import Cursor
from ..errors import ResumptionDesyncError, StorageError, UnknownSessionError
from ..verdicts import Event, Evidence, Resumption, Verdict
from .messages import GET_STREAM, decode_message, encode_message, is_response, sequence_name
from .metrics import STORAGE_ERROR, ResumptionObserver
from .replica import GET_CHECK_FACTOR
from .tail import Tail

if TYPE_CHECKING:
    from mcp.server.connection import Connection

    from .replica import Replica

__all__ = [
    "GET_STREAM",
    "Attachment",
    "ReplayEventStore",
    "SessionEventStore",
]

logger = logging.getLogger("replaystore.mcp")

#: Request streams a view remembers as answered (beyond that, the store's lease record says).
_ANSWERED_MEMORY = 4096

#: The error a client gets for a request whose server replica stopped mid-call.
LOST_REQUEST = "request lost: its server replica stopped"

#: Seconds between two store checks of a live connection without a replica
#: (a view used on its own); with one, the replica's ``check_interval``.
_STANDALONE_CHECK = 1.0


@dataclass(slots=True)
class Attachment:
    """What a connection that (re)attaches to a stream gets.

    ``replay`` holds the missed messages (priming events left out) with their
    positions; ``tail`` the live feed, or None when the stream is already
    finished (its response is in the replay). ``first`` is a priming event id
    to send right after the replay, when the live feed will not read it from
    the store (the store keeps one priming event where several follow each
    other, so a fresh priming event may be the very event the client resumed
    from).
    """

    resumption: Resumption
    stream: str | None = None
    replay: list[tuple[int, EventMessage]] = field(default_factory=list)
    tail: Tail | None = None
    first: str | None = None

    @property
    def ok(self) -> bool:
        return self.resumption.ok


class ReplayEventStore(EventStore):
    """The object an application creates: a ``ReplayBuffer`` plus an observer.

    It is an ``EventStore`` only so that it can be passed where the SDK or
    FastMCP expect one; it refuses to store or replay on its own, because it
    does not know which session a call belongs to. The session manager of
    :mod:`replaystore.mcp.manager` replaces it, per session, with
    :meth:`for_session`. Using it with a stock manager fails loudly (HTTP 500 on
    the first request) instead of mixing sessions.
    """

    def __init__(self, buffer: ReplayBuffer, *, observer: ResumptionObserver | None = None) -> None:
        self.buffer = buffer
        self.observer = observer

    def for_session(self, session_id: str, replica: Replica | None = None) -> SessionEventStore:
        """A view bound to one real ``Mcp-Session-Id`` (served by ``replica``, if given)."""
        return SessionEventStore(self, session_id, replica)

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
    attached, any replica serving any stream) come from the session manager
    and :class:`~replaystore.mcp.transport.ReplayTransport`, which use
    :meth:`attach_resume` and :meth:`attach_get`.
    """

    def __init__(
        self, parent: ReplayEventStore, session_id: str, replica: Replica | None = None
    ) -> None:
        self.parent = parent
        self.buffer = parent.buffer
        self.session_id = session_id
        self.replica = replica
        self._opened = False
        self._dead = False  # ended (failed verdict, DELETE) or no longer served here
        self._tails: dict[str, Tail] = {}
        self._answered: dict[str, None] = {}  # request streams answered here (bounded)
        self._said_dead = False
        self._incarnation = uuid.uuid4().hex[:12]
        self._appends = 0
        self._get_mark: str | None = None
        #: The SDK connection of this session's loop (set by the manager), for
        #: its ``initialize`` parameters; and the credential that created it.
        self.connection: Connection | None = None
        self.owner = ""
        self._recorded = False
        #: Called (synchronously) when an append fails: the session can no
        #: longer prove continuity, so the manager forgets it here.
        self.on_failure: Callable[[BaseException], None] | None = None
        #: Set by the session manager: forget the session in this process.
        self.discard: Callable[[], Awaitable[None]] | None = None

    def adopted(self, record: dict[str, str]) -> None:
        """This view serves a session another replica created (it exists in the store)."""
        self._opened = self._recorded = True
        self._get_mark = record.get("get") or None

    def check_interval(self, sequence: str) -> float:
        """Seconds between two store checks of a live connection following ``sequence``."""
        base = self.replica.check_interval if self.replica is not None else _STANDALONE_CHECK
        return base * GET_CHECK_FACTOR if sequence == GET_STREAM else base

    # ------------------------------------------------------------------ SDK API

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Append one event; ``message=None`` is a priming event (a position, never replayed)."""
        sequence = sequence_name(str(stream_id))
        if self._dead:
            # The session ended (or is no longer served here) while a tool
            # still runs: expected, not an error; said once.
            self._say_ended()
            return ""
        payload = None if message is None else encode_message(message)
        if payload is not None and len(payload) > self.buffer.retention.max_payload:
            payload = self._oversized(sequence, message, len(payload))
        try:
            if message is not None and is_response(message) and not self._recorded:
                await self._record()
            event_id = await self._append(sequence, payload)
        except Exception:
            # Logged once by _append; the manager drops the session here. Not
            # raised: the SDK's message router would die with a traceback.
            return ""
        if sequence != GET_STREAM and is_response(message):
            self._answered[sequence] = None
            if len(self._answered) > _ANSWERED_MEMORY:
                del self._answered[next(iter(self._answered))]
        if self.replica is not None:
            self.replica.wake(self.session_id, sequence)
            if sequence != GET_STREAM and is_response(message):
                self.replica.release(self.session_id, sequence)
        else:
            self.wake_local(sequence)
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """The SDK contract, made strict: raise instead of returning None on a failed verdict.

        The SDK turns both into an empty HTTP 200; :class:`ReplayTransport`
        never calls this (it answers 404). Kept for callers that drive the
        store directly.
        """
        resumption = await self._resolve(last_event_id, None)
        if not resumption.ok:
            raise ResumptionDesyncError(resumption)
        for event in resumption.events:
            message = _message(event)
            if message is not None:
                await send_callback(EventMessage(message, event.event_id))
        return resumption.sequence

    # ------------------------------------------------------- attach / detach

    async def attach_resume(
        self, last_event_id: str, *, prime: bool, sequence: str | None = None
    ) -> Attachment:
        """Resolve ``last_event_id`` and, if it resumes, register a live tail after the replay.

        With ``prime`` a priming event is appended after the replay (it
        reaches the client in position order, through the tail). Raises
        :class:`StorageError` when the verdict is unknown.
        """
        await self._watch()
        try:
            attachment = await self._resume(last_event_id, sequence=sequence, prime=prime)
        except BaseException:
            await self._unwatch()
            raise
        if attachment.tail is None:
            await self._unwatch()
        return attachment

    async def attach_get(self, *, prime: bool) -> Attachment:
        """Attach a plain GET (no ``Last-Event-ID``) to the standalone stream.

        The session remembers (in the store) the last GET-stream event handed
        to a GET connection, or an anchor stored when the session began. A
        plain GET resumes from that mark, so messages stored while no GET was
        attached are delivered. The store proves it per sequence: the mark
        resumes even when its own event was evicted, as long as no event of
        the GET stream after it was; otherwise this is a failed resumption
        like any other (404), never a fresh stream that silently skips them.
        Without a mark, a priming event starts a fresh stream, so the client
        holds a resumable cursor at once.
        """
        await self._watch()
        try:
            attachment = await self._attach_get(prime)
        except BaseException:
            await self._unwatch()
            raise
        if attachment.tail is None:
            await self._unwatch()
        return attachment

    async def _attach_get(self, prime: bool) -> Attachment:
        mark = await self._current_get_mark()
        if mark is not None:
            return await self._resume(mark, sequence=GET_STREAM, prime=prime)
        if self._dead:
            return Attachment(_vanished(self.session_id))
        try:
            anchor = await self._append(GET_STREAM, None)
        except UnknownSessionError:
            return Attachment(_vanished(self.session_id))
        await self._take_over(GET_STREAM)
        tail = self._register(GET_STREAM, anchor)
        return Attachment(
            Resumption(Verdict.RESUMED, Evidence(self.session_id, "attached live")),
            stream=GET_STREAM,
            tail=tail,
            first=anchor,
        )

    async def catch_up(self, tail: Tail) -> Resumption:
        """Everything stored on the tail's stream after its last event, in one atomic read.

        A failed verdict here means events the connection never got are gone
        (evicted while it was slow): the store tore the session down.
        """
        if self.replica is None:
            return await self.buffer.resolve_and_replay(
                self.session_id, tail.last_id, tail.sequence
            )
        async with self.replica.reads:
            return await self.buffer.resolve_and_replay(
                self.session_id, tail.last_id, tail.sequence
            )

    def delivered(self, tail: Tail, event_id: str) -> None:
        """A connection handed ``event_id`` to its client (tracks the GET stream's mark)."""
        if tail.sequence == GET_STREAM and self._tails.get(GET_STREAM) is tail:
            self._get_mark = event_id

    async def detach(self, tail: Tail) -> None:
        """A connection ended: forget its tail, save the GET mark, stop watching."""
        tail.close()
        if self._tails.get(tail.sequence) is not tail:
            return
        del self._tails[tail.sequence]
        if tail.sequence == GET_STREAM and self._get_mark and self.replica is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                try:
                    await self.replica.registry.update_session(
                        self.session_id, {"get": self._get_mark}
                    )
                except StorageError:
                    logger.debug("GET mark of session %s not saved", self.session_id)
        await self._unwatch()

    async def end_if_lost(self, tail: Tail) -> None:
        """End a request's stream with an error if the replica running it stopped.

        Called by a connection following the stream when nothing arrived for a
        check interval. The lease lapsed and the store holds no response
        after the tail's position: exactly one replica (the winner of the end
        claim) stores the error response, which every connection on the
        stream then delivers like any other event.
        """
        replica = self.replica
        if replica is None or self._dead:
            return
        session, sequence = self.session_id, tail.sequence
        try:
            if not await replica.lease_lapsed(session, sequence):
                return
            # The response may have been stored just before the lease was released.
            pending = await self.buffer.resolve_and_replay(session, tail.last_id, sequence)
            if not pending.ok or pending.events:
                tail.wake()
                return
            if not await replica.claim_end(session, sequence):
                return
            logger.warning(
                "request %r of session %s lost: the replica running it stopped "
                "(its lease lapsed); ending its stream with an error",
                sequence[:64],
                session,
            )
            error = JSONRPCError(
                jsonrpc="2.0",
                id=_request_id_of(sequence),
                error=ErrorData(code=INTERNAL_ERROR, message=LOST_REQUEST),
            )
            await self.buffer.append(session, sequence, encode_message(error))
        except (StorageError, UnknownSessionError) as exc:
            logger.debug("lease check of %r in session %s: %s", sequence[:64], session, exc)
            return
        replica.wake(session, sequence)

    def wake_all(self) -> None:
        for tail in list(self._tails.values()):
            tail.wake()

    def wake_local(self, sequence: str) -> None:
        tail = self._tails.get(sequence)
        if tail is not None:
            tail.wake()

    def close_stream(self, sequence: str) -> None:
        """End the connection of this process currently following ``sequence``, if any."""
        tail = self._tails.pop(sequence, None)
        if tail is not None:
            tail.close()
            if self.replica is not None:
                self.replica.spawn(self._unwatch)

    def close_local(self) -> None:
        """The session is no longer served by this process (it may live on elsewhere)."""
        self._dead = True
        for sequence in list(self._tails):
            self.close_stream(sequence)

    async def end_everywhere(self) -> None:
        """The session ended (DELETE, failed verdict): in the store and on every replica.

        Bounded and shielded: it runs while the session's tasks are cancelled.
        Closing an already torn-down session keeps its tombstone's verdict.
        """
        self.close_local()
        with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
            try:
                if self._opened:
                    await self.buffer.close_session(self.session_id)
                if self.replica is not None:
                    await self.replica.registry.drop_session(self.session_id)
                    await self.replica.announce_end(self.session_id)
            except StorageError as exc:
                logger.warning("could not end session %s in the store: %s", self.session_id, exc)

    @property
    def is_closed(self) -> bool:
        return self._dead

    # ------------------------------------------------------------ internals

    async def _resume(self, last_event_id: str, *, sequence: str | None, prime: bool) -> Attachment:
        resumption = await self._resolve(last_event_id, sequence)
        if not resumption.ok:
            self._dead = True  # the store tore the session down (or it never existed)
            return Attachment(resumption)
        stream = resumption.sequence
        assert stream is not None  # a resumed verdict always names its sequence
        replay: list[tuple[int, EventMessage]] = []
        last = last_event_id
        finished = False
        for event in resumption.events:
            last = event.event_id
            message = _message(event)
            if message is None:
                continue
            replay.append((event.position, EventMessage(message, event.event_id)))
            if stream != GET_STREAM and is_response(message):
                finished = True
                break
        attachment = Attachment(resumption, stream, replay)
        if not finished and stream != GET_STREAM:
            finished = await self._finished(stream)
        await self._take_over(stream)
        if finished:
            return attachment
        attachment.tail = self._register(stream, last)
        if prime and not self._dead:
            try:
                priming = await self._append(stream, None)
            except UnknownSessionError:
                return Attachment(_vanished(self.session_id))
            if Cursor.parse(priming).position <= Cursor.parse(last).position:
                attachment.first = priming  # not a new event: the tail would not read it
        return attachment

    async def _finished(self, stream: str) -> bool:
        """Whether a request stream was answered before the cursor (resuming it ends at once)."""
        if stream in self._answered:
            return True
        if self.replica is None:
            return False
        return await self.replica.finished(self.session_id, stream)

    async def _resolve(self, last_event_id: str, sequence: str | None) -> Resumption:
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
            raise
        elapsed = time.perf_counter() - started
        if not resumption.ok:
            logger.warning(
                "resumption failed: %s (session %s torn down); evidence=%s",
                resumption.verdict.value,
                self.session_id,
                json.dumps(resumption.evidence.as_dict(), sort_keys=True, default=str)[:2048],
            )
            self._observe(resumption.verdict.value, elapsed, 0)
        else:
            replayed = sum(1 for event in resumption.events if event.payload is not None)
            self._observe(resumption.verdict.value, elapsed, replayed)
        return resumption

    async def _append(self, sequence: str, payload: bytes | None) -> str:
        if self._dead:
            raise UnknownSessionError(self.session_id)
        try:
            if not self._opened:
                await self.buffer.open_session(self.session_id)
                self._opened = True
            if sequence == GET_STREAM and payload is not None and self._get_mark is None:
                # A view without a session record (used on its own): store an
                # anchor just before the first GET message (one atomic step),
                # so that a later plain GET can resume from it.
                anchor, event_id = await self.buffer.append_many(
                    self.session_id, sequence, [None, payload], idempotency_key=self._key()
                )
                self._get_mark = anchor
                return event_id
            return await self.buffer.append(
                self.session_id, sequence, payload, idempotency_key=self._key()
            )
        except UnknownSessionError:
            self._say_ended()
            self._failed(UnknownSessionError(self.session_id))
            raise
        except Exception as exc:
            logger.error(
                "could not store an event of session %s (stream %r): %s; "
                "the session is dropped here, continuity can no longer be proven",
                self.session_id,
                sequence[:64],
                str(exc)[:512],
            )
            self._failed(exc)
            raise

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
        if not self._said_dead:
            self._said_dead = True
            logger.info(
                "session %s ended while a request still ran; its later events are not stored",
                self.session_id,
            )

    def _key(self) -> str:
        """A key unique to this append: the store retries a lost reply without storing twice."""
        self._appends += 1
        return f"{self._incarnation}.{self._appends}"

    def _failed(self, exc: BaseException) -> None:
        if self.on_failure is not None:
            self.on_failure(exc)

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
        anchor = await self._append(GET_STREAM, None)
        self._get_mark = anchor
        fields = {
            "version": connection.protocol_version,
            "client": connection.client_params.model_dump_json(by_alias=True, exclude_none=True),
            "owner": self.owner,
            "get": anchor,
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

    async def _current_get_mark(self) -> str | None:
        if self.replica is None:
            return self._get_mark
        record = await self.replica.registry.get_session(self.session_id)
        if record is None:
            return self._get_mark
        mark = record.get("get") or self._get_mark
        return mark

    async def _take_over(self, sequence: str) -> None:
        """The newest connection takes a stream over: end whatever carried it before, everywhere."""
        self.close_stream(sequence)
        if self.replica is not None:
            if self.replica.on_takeover is not None:
                self.replica.on_takeover(self.session_id, sequence)
            await self.replica.announce_takeover(self.session_id, sequence)

    def _register(self, sequence: str, last_id: str) -> Tail:
        tail = Tail(sequence, last_id)
        self._tails[sequence] = tail
        return tail

    async def _watch(self) -> None:
        if self.replica is not None:
            await self.replica.bus.watch(self.session_id)

    async def _unwatch(self) -> None:
        if self.replica is not None:
            await self.replica.bus.unwatch(self.session_id)

    def _observe(self, verdict: str, seconds: float, replayed: int) -> None:
        observer = self.parent.observer
        if observer is None:
            return
        try:
            observer.on_resumption(self.session_id, verdict, seconds, replayed)
        except Exception:  # metrics must never decide a resumption
            logger.exception("ResumptionObserver %r failed", observer)


def _request_id_of(sequence: str) -> str | int | None:
    """The JSON-RPC id a request stream belongs to, as far as its name tells.

    Stream names are the SDK's ``str(request.id)``: digits were (almost
    always) an integer id. A digest name (an overlong id) cannot be reversed:
    the error then carries a null id, which JSON-RPC allows for errors.
    """
    if sequence.startswith("#"):
        return None
    if sequence.isdigit() or (sequence.startswith("-") and sequence[1:].isdigit()):
        return int(sequence)
    return sequence


def _message(event: Event) -> JSONRPCMessage | None:
    return None if event.payload is None else decode_message(event.payload)


def _vanished(session: str) -> Resumption:
    """The verdict for a session whose store entry disappeared under a live SDK session."""
    return Resumption(
        Verdict.UNKNOWN_SESSION,
        Evidence(session, "the session does not exist in the replay store"),
    )

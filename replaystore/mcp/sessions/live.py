"""Attaching live streams: resume, plain GET, catch-up, takeover.

A connection that resumes a stream (``GET`` + ``Last-Event-ID``) or opens the
standalone GET stream is attached here: the replica resolves and replays in
one atomic store call. A replay that holds the stream's response is the whole
answer: nothing follows it, so nothing is subscribed to or taken over (every
connection still carrying that stream ends with the same response by itself).
Otherwise the replica subscribes to the session's wake-ups, then registers a
:class:`~replaystore.mcp.sessions.tail.Tail` whose first catch-up re-reads the
store after the replay: whatever was appended between the read and the
subscription is read then, whatever comes later wakes it, so the seam stays
exact. The newest connection of a stream takes it over: the one carrying it
before, here or on another replica, is closed. :class:`LiveStreams` holds the tails of one
session on this replica; its session's
:class:`~replaystore.mcp.sessions.event_store.SessionView` owns it, and is
known here only as what live streams need of it (:class:`SessionEvents`).
"""

from __future__ import annotations

import logging
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import anyio

from ...cursor import Cursor
from ...errors import StorageError, UnknownSessionError
from ...verdicts import Evidence, Resumption, Verdict
from .error_responses import unknown
from .messages import GET_STREAM, first_response, ids_of, is_response_payload, payloads_of
from .tail import Tail

if TYPE_CHECKING:
    from ...buffer import ReplayBuffer
    from ...verdicts import Event
    from ..replicas.replica import Replica
    from ..settings import Settings

__all__ = ["Attachment", "LiveStreams", "SessionEvents"]

#: Seconds between two saves of a GET stream's mark while it keeps delivering.
MARK_SAVE_INTERVAL = 0.25

logger = logging.getLogger("replaystore.mcp")


@dataclass(slots=True)
class Attachment:
    """What a connection that (re)attaches to a stream gets.

    ``replay`` holds the missed messages as stored (priming events left out:
    a connection writes them as they are, never decoded); ``tail`` the live
    feed, or None when the stream is already finished (its response is in the
    replay). ``first`` is a priming event id
    to send right after the replay, when the live feed will not read it from
    the store (the store keeps one priming event where several follow each
    other, so a fresh priming event may be the very event the client resumed
    from).
    """

    resumption: Resumption
    stream: str | None = None
    replay: Sequence[Event] = field(default_factory=list)
    tail: Tail | None = None
    first: str | None = None
    #: The last event read (the replay's, or the cursor): where a tail starts.
    last: str = ""
    #: Whether the replay holds the stream's response (it is the whole answer).
    finished: bool = False

    @property
    def ok(self) -> bool:
        return self.resumption.ok


class SessionEvents(Protocol):
    """What live streams need of their session's event store (its ``SessionView``)."""

    #: Ended (a failed verdict, DELETE) or no longer served here; set when a read finds it gone.
    closed: bool

    @property
    def session_id(self) -> str: ...

    @property
    def buffer(self) -> ReplayBuffer: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def replica(self) -> Replica | None: ...

    @property
    def answered(self) -> Container[str]:
        """Request streams answered here (a resume of one ends with its replay)."""

    async def append(self, sequence: str, payload: bytes | None) -> str:
        """Store one event (``None``: a priming event)."""

    async def resolve(self, last_event_id: str, sequence: str | None) -> Resumption:
        """Resolve and replay in one atomic store call."""


class LiveStreams:
    """The live connections of one session on this replica, one :class:`Tail` per stream."""

    def __init__(self, view: SessionEvents) -> None:
        self.view = view
        self.buffer = view.buffer
        self.session_id = view.session_id
        self._tails: dict[str, Tail] = {}
        #: Connections of requests sent again (:meth:`attach_again`): they
        #: follow a stream beside the connection that carries it.
        self._again: dict[str, set[Tail]] = {}
        #: The last GET-stream event handed to a GET connection here (or the
        #: session's anchor): it only moves forward (see :meth:`attach_get`).
        self.get_mark: str | None = None
        #: The mark as last saved in the session's record, and whether a save runs.
        self._saved_mark: str | None = None
        self._saving = False
        #: The plain GETs attaching so far, and the GET-stream tail registered
        #: last (kept once closed: a new plain GET waits until it stopped).
        self._get_ticket = 0
        self._get_tail: Tail | None = None
        #: A resume already read by :meth:`read` (cursor, what it read), used
        #: once by the next :meth:`attach_resume` from that cursor.
        self.pending: tuple[str, Attachment] | None = None

    def check_interval(self, sequence: str) -> float:
        """Seconds between two store checks of a live connection following ``sequence``."""
        settings = self.view.settings
        base = settings.check_interval
        return base * settings.get_check_factor if sequence == GET_STREAM else base

    # ------------------------------------------------------- attach / detach

    async def attach_resume(
        self, last_event_id: str, *, prime: bool, sequence: str | None = None
    ) -> Attachment:
        """Resolve ``last_event_id`` and, if it resumes, register a live tail after the replay.

        With ``prime`` a priming event is appended after the replay (it
        reaches the client in position order, through the tail). Raises
        :class:`StorageError` when the verdict is unknown.
        """
        return await self._resume(last_event_id, sequence=sequence, prime=prime)

    async def attach_again(self, origin: str, stream: str, *, prime: bool) -> Attachment:
        """A request received before, sent again: its stream from its start, then live.

        ``origin`` is the session's origin cursor (:attr:`SessionInfo.origin`).
        The stream is not taken over: the connection carrying it (the first
        POST, whose client may still be listening) keeps it, and both get
        the one response. Raises :class:`StorageError` when the verdict is
        unknown.
        """
        return await self._resume(origin, sequence=stream, prime=prime, again=True)

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

        Never twice, on this replica: the steps below make the position
        chosen here later than every event a GET connection of this replica
        handed its client, and keep it so.

        1. Each plain GET takes a ticket as it arrives. The newest one takes
           the stream over: one that finds, as it is about to register its
           tail, that a newer plain GET arrived meanwhile registers nothing
           and answers an empty stream, having delivered nothing.
        2. It closes the GET connection registered here, and waits until that
           connection's writer can hand its client nothing more
           (:meth:`Tail.stopped`). Every event it handed is marked by then:
           an event is marked the moment it is handed over
           (:class:`~replaystore.mcp.sessions.sse.Handed`). That connection
           was itself registered only after the one before it had stopped,
           so no earlier one still delivers either.
        3. Only then is the mark read: the later, by position, of the one in
           the session's record and the one this replica holds (the record
           may lag behind: marks are saved in the background and when a
           connection ends). Positions of one session only grow, so the later
           mark covers every event handed before it.
        4. The new tail is registered after the replay it follows (nothing is
           awaited between the ticket's check and the registration), and
           whatever carries the stream on other replicas is told to close.

        Store reads are not serialized: a thousand plain GETs at once read
        side by side, and the newest one stays.

        Across replicas the mark is only as fresh as the record: each replica
        saves the marks its GET connections deliver, one write at a time per
        session, in the background, and the final one when the connection
        ends. A plain GET that reaches another replica while the previous GET
        connection is still delivering there, or within the moment its last
        mark takes to be saved, may deliver again what that connection
        delivered in that moment; a client that must never see an event
        twice resumes the GET stream with ``Last-Event-ID`` instead.
        """
        self._get_ticket += 1
        ticket = self._get_ticket
        previous = self._get_tail
        self.close_stream(GET_STREAM)
        if previous is not None:
            await previous.stopped()
        mark = await self._current_get_mark()
        if mark is not None:
            return await self._resume(mark, sequence=GET_STREAM, prime=prime, ticket=ticket)
        if self._dead:
            return Attachment(unknown(self.session_id, served=True))
        try:
            anchor = await self._append(GET_STREAM, None)
        except UnknownSessionError:
            return Attachment(unknown(self.session_id, served=True))
        resumption = Resumption(Verdict.RESUMED, Evidence(self.session_id, "attached live"))
        tail = await self._take_over(GET_STREAM, anchor, ticket)
        if tail is None:
            return _superseded(resumption)
        return Attachment(resumption, stream=GET_STREAM, tail=tail, first=anchor)

    async def catch_up(self, tail: Tail) -> Resumption:
        """Everything stored on the tail's stream after its last event, in one atomic read.

        A failed verdict here means events the connection never got are gone
        (evicted while it was slow): the store tore the session down.
        """
        replica = self.view.replica
        if replica is None:
            return await self.buffer.resolve_and_replay(
                self.session_id, tail.last_id, tail.sequence
            )
        async with replica.reads:
            return await self.buffer.resolve_and_replay(
                self.session_id, tail.last_id, tail.sequence
            )

    def delivered(self, tail: Tail, event_id: str) -> None:
        """A connection handed ``event_id`` to its client (moves the GET stream's mark on).

        Any GET-stream connection counts, also one already taken over: what
        it handed, its client got. The mark only moves forward; the record
        follows in the background, one write at a time (:meth:`_save_marks`).
        """
        if tail.sequence != GET_STREAM or event_id == self.get_mark:
            return  # (each event is reported by both sides of its hand-over)
        if not _later(event_id, self.get_mark):
            return
        self.get_mark = event_id
        replica = self.view.replica
        if replica is not None and replica.running and not self._saving:
            self._saving = True
            replica.spawn(self._save_marks)

    async def detach(self, tail: Tail) -> None:
        """A connection ended: forget its tail, save the GET mark, stop watching."""
        tail.close()
        again = self._again.get(tail.sequence)
        if again is not None and tail in again:
            again.discard(tail)
            if not again:
                del self._again[tail.sequence]
            await self._unwatch()
            return
        if self._tails.get(tail.sequence) is not tail:
            return
        del self._tails[tail.sequence]
        if tail.sequence == GET_STREAM:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                await self._save_mark()
        await self._unwatch()

    def wake(self, sequence: str) -> None:
        """New events of ``sequence`` may be in the store: its connection here re-reads."""
        tail = self._tails.get(sequence)
        if tail is not None:
            tail.wake()
        for again in self._again.get(sequence, ()):
            again.wake()

    def wake_all(self) -> None:
        for tail in list(self._tails.values()):
            tail.wake()
        for tails in list(self._again.values()):
            for again in tails:
                again.wake()

    def close_stream(self, sequence: str) -> None:
        """End the connections of this process currently following ``sequence``, if any."""
        tails = list(self._again.pop(sequence, ()))
        tail = self._tails.pop(sequence, None)
        if tail is not None:
            tails.append(tail)
        for each in tails:
            each.close()
            if self.view.replica is not None:
                self.view.replica.spawn(self._unwatch)

    def close_all(self) -> None:
        for sequence in {*self._tails, *self._again}:
            self.close_stream(sequence)

    # ------------------------------------------------------------ internals

    @property
    def _dead(self) -> bool:
        return self.view.closed

    async def _append(self, sequence: str, payload: bytes | None) -> str:
        return await self.view.append(sequence, payload)

    async def read(self, last_event_id: str, sequence: str | None = None) -> Attachment:
        """Resolve and replay, attaching nothing: the verdict, the replay, whether it is whole.

        A replay that holds its stream's response (``finished``) is the whole
        answer to a resume; otherwise a tail must follow from ``last``.
        Raises :class:`StorageError` when the verdict is unknown.
        """
        resumption = await self.view.resolve(last_event_id, sequence)
        if not resumption.ok:
            self.view.closed = True  # the store tore the session down (or it never existed)
            return Attachment(resumption)
        stream = resumption.sequence
        assert stream is not None  # a resumed verdict always names its sequence
        replay, last, finished = _replayed(resumption.events, stream, last_event_id)
        if not finished and stream != GET_STREAM and await self._finished(stream):
            # Answered, but the response may have been stored after the
            # snapshot above was read: read what follows it before ending the
            # stream, or it would end without the call's result.
            rest = await self.catch_up(Tail(stream, last))
            if not rest.ok:
                self.view.closed = True  # the store tore the session down
                return Attachment(rest)
            more, last, _ = _replayed(rest.events, stream, last)
            replay = [*replay, *more]
            finished = True
        return Attachment(resumption, stream, replay, last=last, finished=finished)

    async def _resume(
        self,
        last_event_id: str,
        *,
        sequence: str | None,
        prime: bool,
        again: bool = False,
        ticket: int | None = None,
    ) -> Attachment:
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] == last_event_id and sequence is None and not again:
            attachment = pending[1]
        else:
            attachment = await self.read(last_event_id, sequence)
        if not attachment.ok or attachment.finished:
            # The replay is the whole answer: no tail, no subscription, no
            # takeover (a connection still carrying this stream ends with the
            # same response by itself).
            return attachment
        stream, last = attachment.stream, attachment.last
        assert stream is not None
        if again:
            tail = await self._follow_again(stream, last)
        else:
            taken = await self._take_over(stream, last, ticket)
            if taken is None:
                return _superseded(attachment.resumption)
            tail = taken
        attachment.tail = tail
        if prime and not self._dead:
            try:
                priming = await self._append(stream, None)
            except UnknownSessionError:
                await self.detach(tail)
                return Attachment(unknown(self.session_id, served=True))
            except BaseException:
                await self.detach(tail)
                raise
            if Cursor.parse(priming).position <= Cursor.parse(last).position:
                attachment.first = priming  # not a new event: the tail would not read it
        return attachment

    async def _finished(self, stream: str) -> bool:
        """Whether a request stream was answered before the cursor (resuming it ends at once)."""
        if stream in self.view.answered:
            return True
        replica = self.view.replica
        if replica is None:
            return False
        return await replica.finished(self.session_id, stream)

    async def _current_get_mark(self) -> str | None:
        """Where a plain GET resumes: the later of the record's mark and this replica's."""
        replica = self.view.replica
        if replica is None:
            return self.get_mark
        record = await replica.registry.get_session(self.session_id)
        stored = record.get("get") if record is not None else None
        return stored if stored and _later(stored, self.get_mark) else self.get_mark

    async def _save_marks(self) -> None:
        """Save the GET mark until the record holds the latest one (one write at a time).

        The first delivery is saved at once; later ones at most once per
        :data:`MARK_SAVE_INTERVAL`, so a stream that keeps delivering costs the
        store a few writes a second, never one per event.
        """
        try:
            while await self._save_mark():
                await anyio.sleep(MARK_SAVE_INTERVAL)
                if self.get_mark == self._saved_mark:
                    break
        finally:
            self._saving = False

    async def _save_mark(self) -> bool:
        """Raise the record's GET mark to this replica's (never lowers one saved elsewhere).

        False when the store refused it: the next delivery, or the end of the
        connection, tries again.
        """
        mark, replica = self.get_mark, self.view.replica
        if mark is None or replica is None or mark == self._saved_mark:
            return True
        try:
            await replica.registry.raise_mark(self.session_id, "get", mark)
        except StorageError:
            logger.debug("GET mark of session %s not saved", self.session_id)
            return False
        self._saved_mark = mark
        return True

    async def _take_over(
        self, sequence: str, last_id: str, ticket: int | None = None
    ) -> Tail | None:
        """The newest connection takes a stream over: end whatever carried it before, everywhere.

        Returns the new connection's tail, registered after ``last_id`` and
        subscribed to the session's wake-ups; None, registering nothing, for
        a plain GET's ``ticket`` when a newer plain GET arrived meanwhile
        (see :meth:`attach_get`). Closing the connections
        carrying the stream here and registering the new tail happen in one
        step, with nothing awaited between them: of connections attaching at
        the same time, the last one registered holds the stream and every
        other one is closed. Registered after an await, one tail could replace
        another without closing it, leaving a connection open that no message
        reaches.
        """
        await self._watch()
        if ticket is not None and ticket != self._get_ticket:
            await self._unwatch()
            return None
        self.close_stream(sequence)
        replica = self.view.replica
        if replica is not None:
            replica.sessions.taken_over(self.session_id, sequence)
        tail = self._register(sequence, last_id)
        if replica is not None:
            try:
                await replica.announce_takeover(self.session_id, sequence)
            except BaseException:
                await self.detach(tail)
                raise
        return tail

    async def _follow_again(self, sequence: str, last_id: str) -> Tail:
        """A tail beside the connection that carries ``sequence`` (a request sent again)."""
        await self._watch()
        tail = Tail(sequence, last_id)
        self._again.setdefault(sequence, set()).add(tail)
        return tail

    def _register(self, sequence: str, last_id: str) -> Tail:
        tail = Tail(sequence, last_id)
        self._tails[sequence] = tail
        if sequence == GET_STREAM:
            self._get_tail = tail
        return tail

    async def _watch(self) -> None:
        """Subscribe to the session's wake-ups for one more tail (released by :meth:`detach`)."""
        if self.view.replica is not None:
            try:
                await self.view.replica.bus.watch(self.session_id)
            except BaseException:
                await self._unwatch()  # the count was taken before the subscription failed
                raise

    async def _unwatch(self) -> None:
        if self.view.replica is not None:
            await self.view.replica.bus.unwatch(self.session_id)


def _replayed(events: Sequence[Event], stream: str, last: str) -> tuple[Sequence[Event], str, bool]:
    """The events a resume sends of ``events``: priming events left out, up to a request
    stream's response; the id of the last event taken, and whether the response was among
    them. The events themselves when all are sent (a replay stays in its columns)."""
    if not events:
        return events, last, False
    payloads = payloads_of(events)
    if None in payloads:  # priming events (a stream's first): taken one by one
        return _each_replayed(events, stream, last)
    response = None if stream == GET_STREAM else first_response(payloads)  # type: ignore[arg-type]
    if response is None:
        return events, ids_of(events)[-1], False
    taken = events[: response + 1]
    return taken, ids_of(taken)[-1], True


def _each_replayed(
    events: Sequence[Event], stream: str, last: str
) -> tuple[list[Event], str, bool]:
    """:func:`_replayed`, event by event."""
    replay: list[Event] = []
    for event in events:
        last = event.event_id
        if event.payload is None:
            continue
        replay.append(event)
        if stream != GET_STREAM and is_response_payload(event.payload):
            return replay, last, True
    return replay, last, False


def _superseded(resumption: Resumption) -> Attachment:
    """A plain GET a newer one replaced before it began: an empty stream, delivered at once."""
    return Attachment(resumption, GET_STREAM, finished=True)


def _later(event_id: str, than: str | None) -> bool:
    """Whether ``event_id`` comes after ``than`` in its session (by position; None: before all)."""
    return than is None or _position(event_id) > _position(than)


def _position(event_id: str) -> int:
    """An event id's position (-1 for anything that is not an event id)."""
    cursor = Cursor.try_parse(event_id)
    return -1 if cursor is None else cursor.position

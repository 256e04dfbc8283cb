"""A request sent again: recognized by its id, never run twice.

A balancer that retries a POST after the first replica took it (the replica
died before answering, the connection broke, a timeout) sends a request that
may already run, or have run; two copies may even arrive at two replicas at
once. JSON-RPC request ids are never reused within a session, so the
session and the id name the request: its lease (a set-if-absent in the
store, so exactly one replica takes it) and its stream tell whether it was
received before. The copy is then attached to the request's stream from its
start (see :meth:`ReplayTransport._answer_again
<replaystore.mcp.sessions.transport.ReplayTransport>`), like a client resuming it.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator
from contextlib import suppress
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from ...backends.session_registry import FINISHED
from ...errors import StorageError, UnknownSessionError
from ...info import SessionInfo
from .lost import LOST_REQUEST, end_unanswered
from .messages import GET_STREAM

if TYPE_CHECKING:
    from .view import SessionView

__all__ = ["Lease", "bounded", "give_back", "note_refusal", "stream_origin", "take_lease"]


class Lease(enum.Enum):
    """What taking a POSTed request's lease found."""

    TAKEN = "taken"  #: the request runs here
    RECEIVED = "received"  #: the request was received before: it must not run again
    GONE = "gone"  #: the store no longer has the session


#: The store's latest refusal inside the innermost :func:`bounded` block (a
#: holder the block's own tasks share: a context is copied, the holder is not).
_REFUSED: ContextVar[list[StorageError] | None] = ContextVar("_REFUSED", default=None)


def bounded(seconds: float) -> _Bounded:
    """Give up on the store after ``seconds``: a :class:`StorageError`, answered 503.

    When a call in the block was refused and was being tried again (an
    append waits out a short outage), the client is told what the store
    said (see :func:`note_refusal`), not that it did not answer.
    """
    return _Bounded(seconds)


class _Bounded:
    """:func:`bounded`'s block: an anyio cancel scope with a deadline, written out.

    Every request and every resume passes one or more of these, so it is a
    class rather than generators around ``anyio.fail_after``: half the cost
    (about 6 µs instead of 12), with the same semantics (a shielded scope
    inside still holds the deadline off until it ends).
    """

    __slots__ = ("_refused", "_scope", "_seconds", "_token")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    def __enter__(self) -> None:
        self._refused: list[StorageError] = []
        self._token = _REFUSED.set(self._refused)
        self._scope = anyio.CancelScope(deadline=anyio.current_time() + self._seconds)
        self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            swallowed = bool(self._scope.__exit__(exc_type, exc, tb))
        finally:
            _REFUSED.reset(self._token)
        if not self._scope.cancelled_caught:
            return swallowed
        if self._refused:  # the deadline came while a refused call was being tried again
            last = self._refused[-1]
            raise StorageError(str(last), kind=last.kind, permanent=last.permanent) from exc
        raise StorageError(f"the replay store did not answer within {self._seconds:g} s") from exc


def note_refusal(exc: StorageError) -> None:
    """A store call failed and is tried again: what the store said, if the bound runs out."""
    holder = _REFUSED.get()
    if holder is not None and exc.kind != "unreachable":
        holder[:] = [exc]


async def take_lease(view: SessionView, stream: str) -> Lease:
    """Take the request's lease, unless the request was received before.

    A request whose lease is held (it runs, here or on another replica), or
    whose stream is already stored (it ran, or its replica stopped), is the
    same request sent again: it must not run twice. Of two replicas receiving
    it at once, exactly one takes the lease.

    The lease and a look at the session, in one round trip's time: a session
    the store lost (expired, a restart without persistence) would otherwise
    be found out by the tool's first append, with its response already
    started: a cut stream instead of the 404 that tells the client to
    initialize again.
    """
    replica = view.replica
    assert replica is not None
    info: SessionInfo | None = None
    taken = False

    async def look() -> None:
        nonlocal info
        info = await view.buffer.session_info(view.session_id)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(look)
            taken = await replica.acquire(view.session_id, stream)
    except BaseExceptionGroup as group:
        # Either call's StorageError (or a session gone), as the one error
        # the caller answers (503, 404), not a group that becomes a 500. A
        # lease taken for a request that is not run is given back, so that
        # the client's retry runs it.
        if taken:
            await give_back(view, stream)
        raise _first(group) from None
    if info is None:
        if taken:
            await replica.give_back(view.session_id, stream)
        return Lease.GONE
    if stream == GET_STREAM:  # a request id that names the standalone stream
        return Lease.TAKEN
    if taken and stream not in info.sequences:
        return Lease.TAKEN
    if taken:
        # Its stream is stored but nobody holds its lease: it was answered
        # long ago, or its replica stopped (the lease lapsed): the connection
        # following its stream then answers it as lost.
        await replica.give_back(view.session_id, stream)
    return Lease.RECEIVED


async def give_back(view: SessionView, stream: str) -> None:
    """Give back the lease of a request that is not run after all, so that its retry runs it.

    Shielded and bounded: it runs while the request is answered with an error
    (or cancelled). A store that refuses it leaves the lease to lapse: until
    then, a retry is taken for the same request received before.
    """
    replica = view.replica
    assert replica is not None
    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0), suppress(StorageError):
        await replica.give_back(view.session_id, stream)


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error a caller answers, out of a task group's: a store error before any other."""
    errors = list(_leaves(group))
    for kind in (StorageError, UnknownSessionError):
        for error in errors:
            if isinstance(error, kind):
                return error
    return group


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


async def stream_origin(view: SessionView, stream: str) -> str | None:
    """The cursor that replays ``stream`` from its start, once it is stored.

    The replica running the request stores its stream's first event right
    after it took the lease (a priming event; with older clients, its
    first message); until then, wait, as long as that replica holds the
    lease, as the first POST waits for its answer. If that replica stopped
    before storing anything (its lease lapsed), store the "request lost"
    error here, under the end claim every replica uses. None when the
    stream cannot be replayed from its start (its first events were
    evicted, or nothing of an answered request is left). Raises
    :class:`StorageError` when the store does not answer (or the lost
    error, claimed by another replica, never appears), and
    :class:`UnknownSessionError` for a session the store no longer has.
    """
    replica = view.replica
    assert replica is not None
    session = view.session_id
    settings = replica.settings
    patience = settings.lease_ttl + 2 * settings.check_interval
    deadline = time.monotonic() + patience
    pause = 0.01
    while True:
        with bounded(settings.store_timeout):
            info = await view.buffer.session_info(session)
            if info is None:
                raise UnknownSessionError(session)
            if stream in info.sequences:
                origin = str(info.origin)
                probe = await view.buffer.resolve(session, origin, stream)
                return origin if probe.ok else None
            holder = await replica.registry.owner(session, stream)
            if holder == FINISHED:
                return None
            if holder is None:
                await end_unanswered(replica, session, stream, LOST_REQUEST)
            else:  # it runs: wait for its first event
                deadline = time.monotonic() + patience
        if time.monotonic() > deadline:
            raise StorageError("the error response of a lost request was not stored")
        await anyio.sleep(pause)
        pause = min(pause * 2, settings.check_interval)

"""A POSTed request's lease: it runs once, wherever it lands, and always gets an answer.

A request takes a lease on its stream (a set-if-absent in the store, so
exactly one replica takes it) before it runs; the lease is renewed while it
runs (see :mod:`replaystore.mcp.replicas.replica`) and released when its
response is stored. The lease decides the two cases the SDK alone gets wrong:

- **A request sent again.** A balancer that retries a POST after the first
  replica took it (the replica died before answering, the connection broke,
  a timeout) sends a request that may already run, or have run; two copies
  may even arrive at two replicas at once. JSON-RPC request ids are never
  reused within a session, so the session and the id name the request: its
  lease and its stream tell whether it was received before
  (:func:`take_lease`). The copy is then attached to the request's stream
  from its start (:func:`stream_origin`, then :meth:`ReplayTransport._answer_again
  <replaystore.mcp.sessions.transport.ReplayTransport>`), like a client resuming it.
- **A request whose replica stopped.** If the replica running it is killed or
  cut off, nobody will ever store its response, and a client following its
  stream (on any replica) would wait forever. A connection that read nothing
  for a check interval calls :func:`end_if_lost`: once the lease has lapsed
  and the store holds no response, exactly one replica (the winner of the end
  claim) stores a JSON-RPC error response, which every connection on the
  stream then delivers like any other event.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Iterator
from contextlib import suppress
from typing import TYPE_CHECKING

import anyio
from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError

from ...backends.session_registry import FINISHED
from ...errors import StorageError, UnknownSessionError
from ...info import SessionInfo
from ..refusals import bounded
from .messages import GET_STREAM, NO_RESPONSE, encode_message, request_id_of, response_id

if TYPE_CHECKING:
    from ...buffer import ReplayBuffer
    from ..replicas.replica import Replica
    from .event_store import SessionView
    from .tail import Tail

__all__ = [
    "LOST_REQUEST",
    "STORE_UNREACHABLE",
    "Lease",
    "end_if_lost",
    "end_unanswered",
    "give_back",
    "names_another_request",
    "stopped_by_store",
    "stream_origin",
    "take_lease",
]

logger = logging.getLogger("replaystore.mcp")

#: The error a client gets for a request whose lease lapsed unanswered: the replica
#: that took it stopped mid-call, or its lease write reached a stalled store late,
#: after the request was refused (then it never ran).
LOST_REQUEST = (
    "request lost: the server replica that took it stopped, or lost its store, before answering it"
)

#: The error a client gets for a request that stopped because the store was out of reach.
STORE_UNREACHABLE = (
    "request failed: the server's replay store could not be reached while it ran; "
    "it was stopped and may be sent again"
)


def stopped_by_store(trouble: str) -> str:
    """The error of a request stopped because the store failed it, in the store's words."""
    return f"request failed: {trouble}; it was stopped and may be sent again"


class Lease(enum.Enum):
    """What taking a POSTed request's lease found."""

    TAKEN = "taken"  #: the request runs here
    RECEIVED = "received"  #: the request was received before: it must not run again
    GONE = "gone"  #: the store no longer has the session


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
    if not taken and await replica.take_over(view.session_id, stream):
        # A lease this replica left, late, on a copy it refused: the
        # request never ran, unless its stream was stored since.
        return await _taken_over(view, stream)
    if taken:
        # Its stream is stored but nobody holds its lease: it was answered
        # long ago, or its replica stopped (the lease lapsed): the connection
        # following its stream then answers it as lost.
        await replica.give_back(view.session_id, stream)
    return Lease.RECEIVED


async def _taken_over(view: SessionView, stream: str) -> Lease:
    """The lease of a request refused here before it ran is taken over: it runs, once.

    The stream is read again after the lease is taken (a request that ran
    here stores its response before it lets go of its lease): a stream
    stored means it ran, and the lease is given back.
    """
    replica = view.replica
    assert replica is not None
    try:
        info = await view.buffer.session_info(view.session_id)
    except BaseException:
        await give_back(view, stream)
        raise
    if info is not None and stream not in info.sequences:
        logger.info(
            "request %r of session %s sent again after it was refused unrun: "
            "it runs here, its refused copy's lease taken over",
            stream[:64],
            view.session_id,
        )
        return Lease.TAKEN
    await give_back(view, stream)
    return Lease.GONE if info is None else Lease.RECEIVED


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
                await end_unanswered(view.buffer, replica, session, stream, LOST_REQUEST)
            else:  # it runs: wait for its first event
                deadline = time.monotonic() + patience
        if time.monotonic() > deadline:
            raise StorageError("the error response of a lost request was not stored")
        await anyio.sleep(pause)
        pause = min(pause * 2, settings.check_interval)


async def names_another_request(
    view: SessionView, origin: str, stream: str, request_id: str | int
) -> bool:
    """True when ``stream`` holds the answer of another request than ``request_id``.

    The SDK names a request's stream ``str(id)``: the integer id ``0`` and
    the string id ``"0"`` (two ids to JSON-RPC) share the stream ``"0"``. A
    request whose stream is stored is taken for a copy received before, and
    a copy gets the stored answer; so before a copy is answered so, the id
    of the stored response, with its JSON type, must be the request's own.
    Only a stream whose name spells an integer can be shared (an integer id
    always spells one); for any other name this reads nothing. A stream
    with no response stored yet (the earlier request still runs) cannot
    tell: it is taken for a copy.
    """
    replica = view.replica
    assert replica is not None
    if not isinstance(request_id_of(stream), int):
        return False
    with bounded(replica.settings.store_timeout):
        stored = await view.buffer.resolve_and_replay(view.session_id, origin, stream)
    for event in stored.events:
        if event.payload is None:
            continue
        found = response_id(event.payload)
        if found is not NO_RESPONSE:
            return type(found) is not type(request_id) or found != request_id
    return False


async def end_if_lost(view: SessionView, tail: Tail) -> None:
    """End a request's stream with an error if the replica running it stopped.

    Called by a connection following the stream when nothing arrived for a
    check interval. The lease lapsed and the store holds no response
    after the tail's position: exactly one replica (the winner of the end
    claim) stores the error response, which every connection on the
    stream then delivers like any other event.
    """
    replica = view.replica
    if replica is None or view.closed:
        return
    session, sequence = view.session_id, tail.sequence
    try:
        if not await replica.lease_lapsed(session, sequence):
            return
        # The response may have been stored just before the lease was released.
        pending = await view.buffer.resolve_and_replay(session, tail.last_id, sequence)
        if not pending.ok or pending.events:
            tail.wake()
            return
        if not await replica.claim_end(session, sequence):
            return
        logger.warning(
            "request %r of session %s lost: the replica that took it stopped or lost "
            "its store (its lease lapsed); ending its stream with an error",
            sequence[:64],
            session,
        )
        error = JSONRPCError(
            jsonrpc="2.0",
            id=request_id_of(sequence),
            error=ErrorData(code=INTERNAL_ERROR, message=LOST_REQUEST),
        )
        await view.buffer.append(session, sequence, encode_message(error))
    except (StorageError, UnknownSessionError) as exc:
        logger.debug("lease check of %r in session %s: %s", sequence[:64], session, exc)
        return
    replica.wake(session, sequence)


async def end_unanswered(
    buffer: ReplayBuffer, replica: Replica, session: str, stream: str, message: str
) -> None:
    """Store ``message`` as the error response of a request that stopped unanswered.

    Under the end claim every replica uses for lost requests, so at most one
    error is stored; the request's lease is then dropped. Raises
    :class:`StorageError` while the store is out of reach (the caller tries
    again); a session that ended meanwhile needs nothing.
    """
    try:
        if not await replica.claim_end(session, stream):
            return
        logger.warning(
            "request %r of session %s ended with an error: %s",
            stream[:64],
            session,
            message,
        )
        error = JSONRPCError(
            jsonrpc="2.0",
            id=request_id_of(stream),
            error=ErrorData(code=INTERNAL_ERROR, message=message),
        )
        await buffer.append(session, stream, encode_message(error))
        await replica.registry.abandon(session, stream, replica.id)
    except UnknownSessionError:
        return
    replica.wake(session, stream)

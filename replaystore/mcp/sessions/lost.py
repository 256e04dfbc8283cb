"""Ending lost requests: a request whose replica stopped gets an error, not a hang.

A POSTed request runs on the replica it landed on, under a lease renewed
while it runs (see :mod:`replaystore.mcp.replicas.replica`). If that replica is killed
or cut off, nobody will ever store the request's response, and a client
following its stream (on any replica) would wait forever. A connection that
read nothing for a check interval calls :func:`end_if_lost`: once the lease
has lapsed and the store holds no response, exactly one replica (the winner
of the end claim) stores a JSON-RPC error response, which every connection on
the stream then delivers like any other event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError

from ...errors import StorageError, UnknownSessionError
from .messages import encode_message

if TYPE_CHECKING:
    from ..replicas.replica import Replica
    from .tail import Tail
    from .view import SessionView

__all__ = ["LOST_REQUEST", "STORE_UNREACHABLE", "end_if_lost", "end_unanswered", "stopped_by_store"]

logger = logging.getLogger("replaystore.mcp")

#: The error a client gets for a request whose server replica stopped mid-call.
LOST_REQUEST = "request lost: its server replica stopped"

#: The error a client gets for a request that stopped because the store was out of reach.
STORE_UNREACHABLE = (
    "request failed: the server's replay store could not be reached while it ran; "
    "it was stopped and may be sent again"
)


def stopped_by_store(trouble: str) -> str:
    """The error of a request stopped because the store failed it, in the store's words."""
    return f"request failed: {trouble}; it was stopped and may be sent again"


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
        await view.buffer.append(session, sequence, encode_message(error))
    except (StorageError, UnknownSessionError) as exc:
        logger.debug("lease check of %r in session %s: %s", sequence[:64], session, exc)
        return
    replica.wake(session, sequence)


async def end_unanswered(replica: Replica, session: str, stream: str, message: str) -> None:
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
            id=_request_id_of(stream),
            error=ErrorData(code=INTERNAL_ERROR, message=message),
        )
        await replica.buffer.append(session, stream, encode_message(error))
        await replica.registry.abandon(session, stream, replica.id)
    except UnknownSessionError:
        return
    replica.wake(session, stream)


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

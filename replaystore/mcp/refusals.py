"""What a client and the log are told when the store fails a request: what the store said.

A store that does not answer (down, partitioned, too slow) and one that
answers "no" (out of memory, a read-only replica, a command its ACL forbids)
both end a request with ``503`` and ``Retry-After``: the verdict is unknown
and the session is kept. They are told apart in the words, so that an
operator reading a client's error or the log knows what to fix.

A request whose stream is already open (its ``200`` sent) cannot be answered
``503``: its events that the store took went out with their ids, and the
store then refused one. :func:`answer_in_stream` gives the request its
answer in that stream, a JSON-RPC error with the ``503``'s message and
``data``, sent without an id (it is not stored, so there is nothing to resume
after it), so the stream ends as every request stream does, with the
request's response, and not cut or silent. The session is kept: a refusal is
not a verdict.
"""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server.streamable_http import EventMessage, StreamableHTTPServerTransport
from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError

from ..errors import StorageError
from .sessions.lost import _request_id_of

__all__ = ["answer_in_stream", "store_trouble", "unavailable_error"]

#: Longest text of the store's error repeated to a client or the log.
_LIMIT = 256

#: Seconds an answer given in a stream may wait for room in it.
_DELIVERY = 2.0


def store_trouble(exc: BaseException | None) -> str:
    """One phrase for the log and for clients: why the store did not serve the request."""
    if not isinstance(exc, StorageError) or exc.kind == "unreachable":
        detail = f" ({str(exc)[:_LIMIT]})" if exc is not None and str(exc) else ""
        return f"the replay store did not answer (unreachable or too slow){detail}"
    if exc.kind == "unreplicated":
        return f"the replay store could not make it durable: {str(exc)[:_LIMIT]}"
    nature = "permanently refused" if exc.permanent else "refused"
    return f"the replay store {nature} it: {str(exc)[:_LIMIT]}"


def unavailable_error(
    exc: BaseException | None, *, resumption: bool = False
) -> tuple[str, dict[str, Any]]:
    """The message and ``data`` of the JSON-RPC error a ``503`` carries for ``exc``."""
    detail = "the resumption verdict is unknown, " if resumption else ""
    message = f"Service Unavailable: {store_trouble(exc)}; {detail}retry later"
    data: dict[str, Any] = {"verdict": None, "reason": "storage_error"}
    if isinstance(exc, StorageError):
        data["store"] = exc.kind
    return message, data


async def answer_in_stream(
    transport: StreamableHTTPServerTransport, stream: str, exc: StorageError
) -> bool:
    """Answer the request of ``stream`` (an SDK stream id) on its open POST stream.

    Queued behind what the stream carries already, so the client gets every
    event sent before the refusal, then this error, then the end of the
    response. The stream is taken out of the transport's routing first: a
    later message of the request is not queued behind its answer, and the
    session's teardown in this process (which closes the streams it routes
    to, with what they still hold) leaves this one to end by itself once its
    connection wrote the answer. False when no connection of this process
    carries the stream (a client that resumes is answered from the store).
    """
    channel = transport._request_streams.pop(stream, None)
    if channel is None:
        return False
    send, receive = channel
    message, data = unavailable_error(exc)
    error = ErrorData(code=INTERNAL_ERROR, message=message, data=data)
    answer = JSONRPCError(jsonrpc="2.0", id=_request_id_of(stream), error=error)
    with anyio.move_on_after(_DELIVERY):
        try:
            await send.send(EventMessage(answer, None))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        send.close()  # the connection reads what is queued, then ends
        return True
    # Nobody reads the stream any more (the connection is stuck): end it.
    await send.aclose()
    await receive.aclose()
    return False

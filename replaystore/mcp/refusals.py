"""What a client and the log are told when the store fails a request: what the store said.

A store that does not answer (down, partitioned, too slow) and one that
answers "no" (out of memory, a read-only replica, a command its ACL forbids)
both end a request with ``503`` and ``Retry-After``: the verdict is unknown
and the session is kept. They are told apart in the words, so that an
operator reading a client's error or the log knows what to fix.

A store call that takes too long is given up after a deadline
(:func:`bounded`, or :func:`read_within` for a resume's reads): the client is
then told what the store last said, when it refused a call being tried
again, not only that it did not answer.

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

import asyncio
import weakref
from contextvars import ContextVar
from types import TracebackType
from typing import Any

import anyio
from mcp.server.streamable_http import EventMessage, StreamableHTTPServerTransport
from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError

from ..deadlines import Deadlines
from ..errors import StorageError
from ._sdk.checked import take_request_stream
from .sessions.messages import request_id_of

__all__ = [
    "answer_in_stream",
    "bounded",
    "note_refusal",
    "read_within",
    "store_trouble",
    "unavailable_error",
]

#: Longest text of the store's error repeated to a client or the log.
_LIMIT = 256

#: Seconds an answer given in a stream may wait for room in it.
_DELIVERY = 2.0


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
        raise _gave_up(self._seconds, self._refused) from exc


def _gave_up(seconds: float, refused: list[StorageError]) -> StorageError:
    """Why a bounded block was given up: what the store last said, or that it did not answer."""
    if refused:  # the deadline came while a refused call was being tried again
        last = refused[-1]
        return StorageError(str(last), kind=last.kind, permanent=last.permanent)
    return StorageError(f"the replay store did not answer within {seconds:g} s")


def read_within(seconds: float) -> _ReadWithin | _Bounded:
    """:func:`bounded` for a block that only reads the store and holds no cancel scope.

    A resume's reads are the most frequent bounded block, and an anyio cancel
    scope with a deadline costs more than the whole read's own work. So
    under asyncio the block is registered with its event loop's one timer
    (:class:`~replaystore.deadlines.Deadlines`), which cancels its task at
    the deadline; the block turns that cancellation into the same
    :class:`StorageError` as :func:`bounded`. A native cancellation does not stop at a
    shielded anyio scope, hence "holds no cancel scope". Elsewhere (trio),
    :func:`bounded` itself.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return _Bounded(seconds)
    return _ReadWithin(seconds, loop)


class _ReadWithin:
    """:func:`read_within`'s block under asyncio."""

    __slots__ = ("_deadlines", "_expired", "_refused", "_seconds", "_task", "_token")

    def __init__(self, seconds: float, loop: asyncio.AbstractEventLoop) -> None:
        self._seconds = seconds
        deadlines = _DEADLINES.get(loop)
        if deadlines is None:
            deadlines = _DEADLINES[loop] = Deadlines(_ReadWithin.expire)
        self._deadlines = deadlines

    def __enter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None  # a block of a task's own
        self._task = task
        self._expired = False
        self._refused: list[StorageError] = []
        self._token = _REFUSED.set(self._refused)
        self._deadlines.start(self, self._seconds)

    def expire(self) -> None:
        self._expired = True
        self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._deadlines.stop(self)
        _REFUSED.reset(self._token)
        if self._expired:
            pending = self._task.uncancel()  # this block's own cancellation taken back
            if pending == 0 and isinstance(exc, asyncio.CancelledError):
                raise _gave_up(self._seconds, self._refused) from exc


_DEADLINES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines[_ReadWithin]] = (
    weakref.WeakKeyDictionary()
)


def note_refusal(exc: StorageError) -> None:
    """A store call failed and is tried again: what the store said, if the bound runs out."""
    holder = _REFUSED.get()
    if holder is not None and exc.kind != "unreachable":
        holder[:] = [exc]


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
    channel = take_request_stream(transport, stream)
    if channel is None:
        return False
    send, receive = channel
    message, data = unavailable_error(exc)
    error = ErrorData(code=INTERNAL_ERROR, message=message, data=data)
    answer = JSONRPCError(jsonrpc="2.0", id=request_id_of(stream), error=error)
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

"""A store that fails a 2026-07-28 request: ``503`` with ``Retry-After``, as on a session.

On a 2025-11-25 session, a store that does not answer (or refuses) ends the
request with ``503`` and ``Retry-After``, which a balancer retries on another
replica and a client retries later. A 2026-07-28 request is answered by the
SDK's single-exchange transport, which sends every handler error with the
status of its JSON-RPC code: ``200`` for -32603. So the tasks extension
raises :func:`store_unavailable` (a -32603 error whose ``data`` is the one a
session's ``503`` carries), and :class:`UnavailableStatus`, around the whole
app, gives such a JSON answer its ``503`` and ``Retry-After``. Nothing else
is touched: other answers, SSE streams and every other route pass through
unread.

One stream is the exception: a ``tasks/stream`` response whose events were
already sent, and that this server ends early (the store failed, the replica
drains: :func:`stream_closed`), ends without its final message, since its
only result, ``{}``, means "complete", and an error there would be read as
the stream's outcome. The client resumes it with its cursor, as after a
dropped connection. Before any event, such an end is a ``503`` like any
other.

A request a replica has no room for (:func:`replica_busy`: a ``tasks/stream``
beyond the streams it serves at once) is a ``503`` too: another replica, or
this one later, may serve it.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import count_unavailable
from .refusals import unavailable_error

__all__ = [
    "RETRY_AFTER",
    "UnavailableStatus",
    "is_unavailable",
    "replica_busy",
    "store_unavailable",
    "stream_closed",
]

#: Seconds a client is asked to wait before sending the request again.
RETRY_AFTER = 1

#: The ``data.reason`` that marks an answer the store did not serve.
_REASON = "storage_error"
#: The ``data.reason`` of a stream this server ended early.
_CLOSED = "stream_closed"
#: The ``data.reason`` of a request this replica has no room for now (another may have).
_BUSY = "replica_busy"
#: Every ``data.reason`` answered ``503``.
_REASONS = (_REASON, _CLOSED, _BUSY)
#: The method whose SSE response ends without a result when ended early.
_STREAM_METHOD = b"tasks/stream"
#: A JSON answer larger than this is never a store error: passed on unread.
_LARGEST = 64 * 1024


def store_unavailable(exc: BaseException | None) -> MCPError:
    """The JSON-RPC error of a request the store did not serve; answered ``503``."""
    message, data = unavailable_error(exc)
    return MCPError(INTERNAL_ERROR, message, data)


def stream_closed() -> MCPError:
    """The end of a stream this server closed early: a ``503`` before any event, no result after."""
    return MCPError(
        INTERNAL_ERROR,
        "the server closed the stream early; send the request again (with the last seq as after)",
        {"reason": _CLOSED},
    )


def replica_busy(message: str, limit: int) -> MCPError:
    """The error of a request beyond ``limit`` of this replica: ``503``, tried again elsewhere."""
    return MCPError(INTERNAL_ERROR, message, {"reason": _BUSY, "limit": limit})


def is_unavailable(body: Any) -> bool:
    """Whether ``body`` (a decoded JSON-RPC answer) says the store did not serve the request."""
    if not isinstance(body, dict):
        return False
    error = body.get("error")
    data = error.get("data") if isinstance(error, dict) else None
    return (
        isinstance(error, dict)
        and error.get("code") == INTERNAL_ERROR
        and isinstance(data, dict)
        and data.get("reason") in _REASONS
    )


class UnavailableStatus:
    """ASGI middleware: a JSON answer carrying :func:`store_unavailable` goes out as ``503``.

    Only a ``POST`` answered ``200`` with ``application/json`` in one body is
    read (the single-exchange transport's answers); its start is held back
    until that body arrived, then sent as is or with ``503`` and
    ``Retry-After``.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        stream = _is_task_stream(scope)
        events = False

        async def relay(message: Message) -> None:
            nonlocal held, events
            if message["type"] == "http.response.start" and _worth_reading(message):
                held = message
                return
            if stream and message["type"] == "http.response.start":
                events = _is_sse(message)
            if (
                events
                and message["type"] == "http.response.body"
                and not message.get("more_body", False)
                and _ended_early(message.get("body", b""))
            ):
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            if held is not None and message["type"] == "http.response.body":
                start, held = held, None
                body = message.get("body", b"")
                if not message.get("more_body", False) and len(body) <= _LARGEST:
                    start = _with_status(start, body)
                await send(start)
            await send(message)

        await self.app(scope, receive, relay)


def _is_task_stream(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        if name.lower() == b"mcp-method":
            return bool(value.strip() == _STREAM_METHOD)
    return False


def _is_sse(start: Message) -> bool:
    for name, value in start.get("headers", []):
        if name.lower() == b"content-type":
            return bool(value.lower().startswith(b"text/event-stream"))
    return False


def _ended_early(body: bytes) -> bool:
    """Whether a stream's final SSE frame is the error of an early end (:func:`stream_closed`)."""
    if not _mentions_reason(body):
        return False
    for line in body.splitlines():
        if line.startswith(b"data:"):
            try:
                return is_unavailable(json.loads(line[5:]))
            except ValueError:
                return False
    return False


def _mentions_reason(body: bytes) -> bool:
    return any(reason.encode() in body for reason in _REASONS)


def _worth_reading(start: Message) -> bool:
    if start.get("status") != 200:
        return False
    for name, value in start.get("headers", []):
        if name.lower() == b"content-type":
            return bool(value.lower().startswith(b"application/json"))
    return False


def _with_status(start: Message, body: bytes) -> Message:
    if not _mentions_reason(body):  # most: not parsed
        return start
    try:
        decoded = json.loads(body)
    except ValueError:
        return start
    if not is_unavailable(decoded):
        return start
    count_unavailable(decoded["error"]["data"])
    headers = [(n, v) for n, v in start.get("headers", []) if n.lower() != b"retry-after"]
    headers.append((b"retry-after", str(RETRY_AFTER).encode()))
    return {**start, "status": 503, "headers": headers}

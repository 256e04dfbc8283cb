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
"""

from __future__ import annotations

import json
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import count_unavailable
from .refusals import unavailable_error

__all__ = ["RETRY_AFTER", "UnavailableStatus", "is_unavailable", "store_unavailable"]

#: Seconds a client is asked to wait before sending the request again.
RETRY_AFTER = 1

#: The ``data.reason`` that marks an answer the store did not serve.
_REASON = "storage_error"
#: A JSON answer larger than this is never a store error: passed on unread.
_LARGEST = 64 * 1024


def store_unavailable(exc: BaseException | None) -> MCPError:
    """The JSON-RPC error of a request the store did not serve; answered ``503``."""
    message, data = unavailable_error(exc)
    return MCPError(INTERNAL_ERROR, message, data)


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
        and data.get("reason") == _REASON
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

        async def relay(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and _worth_reading(message):
                held = message
                return
            if held is not None and message["type"] == "http.response.body":
                start, held = held, None
                body = message.get("body", b"")
                if not message.get("more_body", False) and len(body) <= _LARGEST:
                    start = _with_status(start, body)
                await send(start)
            await send(message)

        await self.app(scope, receive, relay)


def _worth_reading(start: Message) -> bool:
    if start.get("status") != 200:
        return False
    for name, value in start.get("headers", []):
        if name.lower() == b"content-type":
            return bool(value.lower().startswith(b"application/json"))
    return False


def _with_status(start: Message, body: bytes) -> Message:
    if _REASON.encode() not in body:  # most answers: not parsed at all
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

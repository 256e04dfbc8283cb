"""The error responses of the session endpoint: a JSON-RPC error with its status (404, 503).

One place builds them, so that a resume answered without an SDK session
(:meth:`~replaystore.mcp.sessions.manager.ReplaySessionManager.answer_unserved`)
and one answered by the session's transport say the same words.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from http import HTTPStatus
from typing import Any

from mcp.server.streamable_http import CONTENT_TYPE_JSON, MCP_SESSION_ID_HEADER
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ...buffer import ReplayBuffer
from ...errors import StorageError
from ...verdicts import Evidence, Resumption, Verdict, reason_text
from ..metrics import count_unavailable
from ..refusals import bounded
from ..unavailable import RETRY_AFTER

__all__ = ["JSONAnswer", "json_error", "not_found", "unavailable", "unknown", "why_gone"]


def json_error(
    session_id: str | None,
    status: HTTPStatus,
    code: int,
    message: str,
    data: dict[str, Any] | None,
    extra_headers: dict[str, str] | None = None,
) -> Response:
    """A JSON-RPC error without an id, answered with ``status`` (and the session's id header)."""
    headers = {"Content-Type": CONTENT_TYPE_JSON, **(extra_headers or {})}
    if session_id:
        headers[MCP_SESSION_ID_HEADER] = session_id
    return Response(_error_body(code, message, data), status_code=int(status), headers=headers)


def _error_body(code: int, message: str, data: dict[str, Any] | None) -> bytes:
    """The JSON-RPC error object without an id, as the body of an error response."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}, default=str).encode()


class JSONAnswer:
    """An error response sent as two ASGI messages, its headers as the server sends them.

    What :func:`json_error` answers (the same status, headers and body),
    without a Starlette :class:`Response` built to be sent once: a refused
    resume answers with it.
    """

    __slots__ = ("body", "headers", "status")

    def __init__(self, session_id: str | None, status: HTTPStatus, body: bytes) -> None:
        self.status = int(status)
        self.body = body
        length = (b"content-length", b"%d" % len(body))
        if session_id:
            session = (_RAW_SESSION_HEADER, session_id.encode("latin-1"))
            self.headers = [_RAW_JSON, session, length]
        else:
            self.headers = [_RAW_JSON, length]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


# Encoded once, as Starlette encodes a response's headers (names lower-cased).
_RAW_JSON = (b"content-type", CONTENT_TYPE_JSON.encode("latin-1"))
_RAW_SESSION_HEADER = MCP_SESSION_ID_HEADER.lower().encode("latin-1")


def unavailable(session_id: str | None, message: str, data: dict[str, Any] | None) -> Response:
    """503 with ``Retry-After``: the store (or this replica) cannot serve it now.

    The session stays: a client retries, here or on another replica.
    """
    retry = {"Retry-After": str(RETRY_AFTER)}
    count_unavailable(data)
    return json_error(
        session_id, HTTPStatus.SERVICE_UNAVAILABLE, INTERNAL_ERROR, message, data, retry
    )


def not_found(session_id: str | None, resumption: Resumption) -> JSONAnswer:
    """404 with the failed verdict and its evidence: the session is gone, initialize again.

    The one answer for every session the server ended or does not know (a
    refused resume, a request for a session the store no longer has), so a
    client reads why from any of them, in the same place.
    """
    verdict, reason = resumption.verdict.value, resumption.evidence.reason
    if resumption.verdict is Verdict.UNKNOWN_SESSION:
        tombstone = resumption.evidence.tombstone
        ended = f"; it ended: {tombstone.verdict or 'closed'}" if tombstone is not None else ""
        message = f"Session not found ({verdict}: {reason}{ended}); initialize a new session"
    else:
        message = (
            f"Not Found: cannot resume ({verdict}: {reason}); the session was terminated, "
            "initialize a new one"
        )
    data = {"verdict": verdict, "evidence": resumption.evidence.as_dict()}
    return JSONAnswer(session_id, HTTPStatus.NOT_FOUND, _error_body(INVALID_REQUEST, message, data))


async def why_gone(
    buffer: ReplayBuffer, session_id: str, store_timeout: float, *, served: bool = False
) -> Resumption:
    """The ``unknown_session`` verdict for a session this server will not serve, with its tombstone.

    The store keeps why a session ended (closed, or the verdict that tore it
    down) for a while; a 404 carries it, so a client (and its operator) see
    why without asking the store. ``served``: this process was serving the
    session, so a store without it and without a tombstone lost it
    (restarted empty, failed over, or the session expired). A session the
    store does know (a request with another credential than its creator's)
    is answered exactly as one that never existed; a store that cannot be
    asked within ``store_timeout`` leaves the tombstone out.
    """
    found: Resumption | None = None
    with contextlib.suppress(StorageError), bounded(store_timeout):
        # No side effects, and "0" is never judged for a missing session.
        found = await buffer.resolve(session_id, "0")
    if found is None or found.verdict is not Verdict.UNKNOWN_SESSION:
        return unknown(session_id, served=served)
    evidence = replace(found.evidence, cursor=None)
    if served and evidence.tombstone is None:
        evidence = replace(evidence, reason=reason_text("vanished"))
    return Resumption(Verdict.UNKNOWN_SESSION, evidence)


def unknown(session_id: str, *, served: bool = False) -> Resumption:
    """``unknown_session``, nothing more known: never issued, or (``served``) lost by the store.

    A session asked for with another credential than its creator's gets the
    first: it reads exactly as one that never existed.
    """
    if served:
        return Resumption(Verdict.UNKNOWN_SESSION, Evidence(session_id, reason_text("vanished")))
    return Resumption(Verdict.UNKNOWN_SESSION, Evidence(session_id, reason_text("no_session")))

"""The JSON answers of the session endpoint: a JSON-RPC error with its status, a failed verdict.

One place builds them, so that a resume answered without an SDK session
(:meth:`~replaystore.mcp.sessions.manager.ReplaySessionManager.answer_unserved`)
and one answered by the session's transport say the same words.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from mcp.server.streamable_http import CONTENT_TYPE_JSON, MCP_SESSION_ID_HEADER
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST
from starlette.responses import Response

from ...verdicts import Resumption
from ..metrics import count_unavailable
from ..unavailable import RETRY_AFTER

__all__ = ["cannot_resume", "json_error", "unavailable"]


def json_error(
    session_id: str | None,
    status: HTTPStatus,
    code: int,
    message: str,
    data: dict[str, Any] | None,
    extra_headers: dict[str, str] | None = None,
) -> Response:
    """A JSON-RPC error without an id, answered with ``status`` (and the session's id header)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    body = {"jsonrpc": "2.0", "id": None, "error": error}
    headers = {"Content-Type": CONTENT_TYPE_JSON, **(extra_headers or {})}
    if session_id:
        headers[MCP_SESSION_ID_HEADER] = session_id
    return Response(json.dumps(body, default=str), status_code=int(status), headers=headers)


def unavailable(session_id: str | None, message: str, data: dict[str, Any] | None) -> Response:
    """503 with ``Retry-After``: the store (or this replica) cannot serve it now.

    The session stays: a client retries, here or on another replica.
    """
    retry = {"Retry-After": str(RETRY_AFTER)}
    count_unavailable(data)
    return json_error(
        session_id, HTTPStatus.SERVICE_UNAVAILABLE, INTERNAL_ERROR, message, data, retry
    )


def cannot_resume(session_id: str | None, resumption: Resumption) -> Response:
    """404 with the failed verdict and its evidence: the session was ended, initialize again."""
    return json_error(
        session_id,
        HTTPStatus.NOT_FOUND,
        INVALID_REQUEST,
        f"Not Found: cannot resume ({resumption.verdict.value}: "
        f"{resumption.evidence.reason}); the session was terminated, "
        "initialize a new one",
        {"verdict": resumption.verdict.value, "evidence": resumption.evidence.as_dict()},
    )

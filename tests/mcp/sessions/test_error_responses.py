"""A refused resume's 404 says exactly what :func:`json_error` would: status, headers, body."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

import pytest
from mcp_types import INVALID_REQUEST

from replaystore import Verdict
from replaystore.mcp.sessions.error_responses import json_error, not_found
from replaystore.verdicts import Evidence, Resumption

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _sent(app: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await app({"type": "http"}, receive, send)
    return messages


@pytest.mark.parametrize("session_id", ["abc123", None])
async def test_a_404_is_sent_as_json_error_sends_it(session_id: str | None) -> None:
    resumption = Resumption(Verdict.FOREIGN_CURSOR, Evidence("abc123", "not an event of it"))
    answer = await _sent(not_found(session_id, resumption))
    body = json.loads(answer[1]["body"])
    assert body["error"]["data"]["verdict"] == "foreign_cursor"
    error = body["error"]
    expected = json_error(
        session_id, HTTPStatus.NOT_FOUND, INVALID_REQUEST, error["message"], error["data"]
    )
    assert answer == await _sent(expected)
    assert answer[0]["status"] == 404 and answer[1].get("more_body", False) is False

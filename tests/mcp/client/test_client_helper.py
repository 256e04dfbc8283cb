"""The resuming client: a failed resumption's verdict reaches the client, which starts anew.

Against a real example-server process on a real Redis that keeps 12 events
per session, so a countdown of 40 evicts the cursor a client resumes from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from fastmcp import Client as FastMCPClient
from fastmcp.client.transports import StreamableHttpTransport
from mcp import MCPError

from replaystore import ResumptionDesyncError, Verdict
from replaystore.mcp.client.resuming import DesyncWatch, ResumingSession, desync_error
from replaystore.testing.servers import ServerHandle
from replaystore.verdicts import Evidence, Tombstone
from tests.mcp._support import (
    EXAMPLE_SERVER,
    RawSession,
    ServerProcess,
    spawn,
    sse_events,
    wait_ready,
)

pytestmark = pytest.mark.anyio

MAX_EVENTS = 12
EVICTING = {"n": 200, "interval_ms": 0, "close_after": 1}


@pytest.fixture(scope="module")
def small_server(
    mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    logs = tmp_path_factory.mktemp("client-helper")
    url = f"{mcp_redis.url}?prefix=clienthelper:"
    server = spawn("client-helper", EXAMPLE_SERVER, url, MAX_EVENTS, logs)
    try:
        wait_ready([server])
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------ the body


def _body(data: object) -> bytes:
    error = {"code": -32600, "message": "Not Found: cannot resume (below_floor)", "data": data}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


def test_desync_error_carries_verdict_and_evidence() -> None:
    evidence = Evidence(
        session="abc",
        reason="the cursor's event has been evicted",
        cursor="0123456789ab-3",
        cursor_position=3,
        floor=9,
        high_water=40,
        sequence="2",
        torn_down=True,
    )
    error = desync_error(_body({"verdict": "below_floor", "evidence": evidence.as_dict()}))
    assert isinstance(error, ResumptionDesyncError)
    assert error.verdict is Verdict.BELOW_FLOOR
    assert error.resumption.evidence == evidence
    assert error.resumption.evidence.as_dict() == evidence.as_dict()
    assert "below_floor" in str(error)


def test_desync_error_keeps_a_tombstone() -> None:
    evidence = Evidence(
        session="abc",
        reason="the session was torn down after a failed resumption",
        tombstone=Tombstone("bad cursor", 1_700_000_000.5, Verdict.MALFORMED_CURSOR),
    )
    error = desync_error(_body({"verdict": "unknown_session", "evidence": evidence.as_dict()}))
    assert error is not None and error.resumption.evidence == evidence


@pytest.mark.parametrize(
    "body",
    [
        b"<html>404</html>",
        b"",
        b"\xff\xfe",
        b"[1, 2]",
        _body(None),
        _body({"reason": "storage_error", "verdict": None}),
        _body({"verdict": "resumed", "evidence": {}}),
        _body({"verdict": "no_such_verdict", "evidence": {}}),
        json.dumps({"jsonrpc": "2.0", "id": 1, "error": "not an object"}).encode(),
    ],
)
def test_bodies_without_a_failed_verdict_are_not_a_desync(body: bytes) -> None:
    assert desync_error(body) is None


def test_odd_evidence_fields_are_dropped_not_fatal() -> None:
    error = desync_error(
        _body({"verdict": "foreign_cursor", "evidence": {"session": "s", "x": 1, "tombstone": 5}})
    )
    assert error is not None and error.verdict is Verdict.FOREIGN_CURSOR
    assert error.resumption.evidence.session == "s"
    assert error.resumption.evidence.tombstone is None
    assert error.resumption.evidence.reason  # the message stands in for a missing reason


# ------------------------------------------------- real server, raw httpx


async def _evicted_cursor(session: RawSession) -> str:
    """Run a countdown of 40 on a POST stream; return its first event id (evicted by then)."""
    request_id, body = session.call("countdown", {"n": 40, "interval_ms": 0}, token="t")
    first: str | None = None
    with anyio.fail_after(15):
        async with session.post(body) as response:
            assert response.status_code == 200
            async for event in sse_events(response):
                first = first or event.id
                message = event.message
                if message and message.get("id") == request_id:
                    break
    assert first is not None
    return first


async def test_httpx_hook_records_the_servers_verdict(small_server: ServerProcess) -> None:
    watch = DesyncWatch()
    async with httpx.AsyncClient(timeout=10, event_hooks={"response": [watch.hook]}) as client:
        session = await RawSession(client, small_server.url).initialize()
        cursor = await _evicted_cursor(session)
        async with session.get(cursor) as response:
            assert response.status_code == 404
    error = watch.pop()
    assert isinstance(error, ResumptionDesyncError)
    assert watch.ended(session.session_id) is error and watch.pop() is None
    assert error.verdict is Verdict.BELOW_FLOOR
    evidence = error.resumption.evidence
    assert evidence.session == session.session_id
    assert evidence.cursor == cursor and evidence.torn_down
    assert evidence.floor is not None and evidence.cursor_position is not None
    assert evidence.cursor_position < evidence.floor


# ------------------------------------------------- real server, SDK client


async def test_sdk_session_raises_the_verdict_and_reinitializes(
    small_server: ServerProcess,
) -> None:
    async def ignore(value: float, total: float | None, message: str | None) -> None:
        pass

    with anyio.fail_after(60):
        async with ResumingSession(small_server.url) as mcp:
            first = mcp.session
            with pytest.raises(ResumptionDesyncError) as raised:
                await mcp.call_tool("countdown", EVICTING, progress_callback=ignore)
            assert raised.value.verdict is Verdict.BELOW_FLOOR
            assert raised.value.resumption.evidence.torn_down
            assert raised.value.__cause__ is not None  # the SDK's own error, kept
            # A fresh session, already initialized: the next call just works.
            assert mcp.session is not first
            result = await mcp.call_tool("countdown", {"n": 3, "interval_ms": 0})
            assert result.content[0].text == "done 3"
            assert mcp.watch.pop() is None


async def test_sdk_session_lets_other_errors_through(small_server: ServerProcess) -> None:
    with anyio.fail_after(30):
        async with ResumingSession(small_server.url) as mcp:
            first = mcp.session
            with pytest.raises(MCPError) as raised:  # a server error, no resumption involved
                await mcp.run(lambda session: session.read_resource("nope://missing"))
            assert not isinstance(raised.value, ResumptionDesyncError)
            assert mcp.session is first  # no failed resumption: the session is kept
            assert (await mcp.call_tool("countdown", {"n": 1, "interval_ms": 0})).content


async def test_fastmcp_client_with_the_watch_sees_the_verdict(
    small_server: ServerProcess, tmp_path: Path
) -> None:
    watch = DesyncWatch()
    transport = StreamableHttpTransport(small_server.url, httpx_client_factory=watch.client_factory)

    async def ignore(value: float, total: float | None, message: str | None) -> None:
        pass

    with anyio.fail_after(60):
        async with FastMCPClient(transport, mode="legacy") as client:
            with pytest.raises(Exception) as raised:
                await client.call_tool("countdown", EVICTING, progress_handler=ignore)
    assert not isinstance(raised.value, ResumptionDesyncError)  # FastMCP says "exhausted"
    seen = watch.pop()
    assert seen is not None and seen.verdict is Verdict.BELOW_FLOOR
    assert watch.pop() is None

"""The priming event stored before a POST's 200 is the one the SDK sends, once; none in JSON mode.

The example server's tools in this event loop (a memory store), so a test
reads each session's view and the store after a request: in SSE mode the
request's stream holds one priming event, the one on the wire, then its
messages; in JSON-response mode (no SSE, no priming event) it holds the
response alone. Either way no priming event is left waiting in a view.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import httpx
import pytest
import uvicorn

from replaystore import ReplayBuffer
from replaystore.cursor import Cursor
from replaystore.mcp import streamable_http_app
from replaystore.mcp.example import build_server
from replaystore.mcp.sessions.event_store import SessionView
from replaystore.mcp.sessions.manager import ReplaySessionManager
from replaystore.mcp.sessions.transport import ReplayTransport
from replaystore.testing.mcp import initialize_message
from replaystore.testing.servers import find_free_port
from replaystore.testing.sse import sse_events
from tests.mcp._support import RawSession, progress_of, result_text

pytestmark = pytest.mark.anyio


@dataclass
class Served:
    url: str
    buffer: ReplayBuffer
    manager: ReplaySessionManager

    def views(self) -> list[SessionView]:
        found = [
            t.view
            for t in self.manager._server_instances.values()
            if isinstance(t, ReplayTransport)
        ]
        return found


async def _serve(json_response: bool) -> AsyncIterator[Served]:
    server = build_server()
    buffer = ReplayBuffer.from_url("memory://priming-wire")
    app = streamable_http_app(server, buffer, json_response=json_response, close_buffer=True)
    manager = server.session_manager
    assert isinstance(manager, ReplaySessionManager)
    port = find_free_port()
    http = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(http.serve)
        with anyio.fail_after(20):
            while not http.started:  # noqa: ASYNC110 - uvicorn offers no event
                await anyio.sleep(0.02)
        try:
            yield Served(f"http://127.0.0.1:{port}/mcp", buffer, manager)
        finally:
            http.should_exit = True


@pytest.fixture
async def sse_mode() -> AsyncIterator[Served]:
    async for served in _serve(json_response=False):
        yield served


@pytest.fixture
async def json_mode() -> AsyncIterator[Served]:
    async for served in _serve(json_response=True):
        yield served


async def test_the_priming_event_on_the_wire_is_the_one_stored(sse_mode: Served) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as http:
        session = await RawSession(http, sse_mode.url).initialize()
        request_id, body = session.call("countdown", {"n": 2, "interval_ms": 0}, token="t")
        with anyio.fail_after(15):
            async with session.post(body) as response:
                events = [event async for event in sse_events(response)]
    assert events[0].priming and events[0].id, events
    assert [progress_of(e) for e in events[1:3]] == [1.0, 2.0], events
    assert result_text(events[-1], request_id) == "done 2", events
    assert [Cursor.parse(e.id).ordinal for e in events if e.id] == [0, 1, 2, 3], events
    info = await sse_mode.buffer.session_info(session.session_id)
    assert info is not None and info.sequences[str(request_id)].retained == 4, info
    assert [view.primed for view in sse_mode.views()] == [{}]


async def test_json_response_mode_stores_no_priming_event(json_mode: Served) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as http:
        session = RawSession(http, json_mode.url)
        headers = session.headers(accept="application/json")
        initialize = initialize_message(session.version)
        response = await http.post(json_mode.url, json=initialize, headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        session.session_id = response.headers["mcp-session-id"]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        headers = session.headers(accept="application/json")
        assert (await http.post(json_mode.url, json=note, headers=headers)).status_code == 202
        request_id, body = session.call("countdown", {"n": 2, "interval_ms": 0}, token="t")
        response = await http.post(json_mode.url, json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["content"][0]["text"] == "done 2"
    info = await json_mode.buffer.session_info(session.session_id)
    assert info is not None, info
    # The response alone, for the call and for initialize: no priming event stored.
    assert info.sequences[str(request_id)].retained == 1, info
    assert info.sequences["0"].retained == 1, info
    assert [view.primed for view in json_mode.views()] == [{}]

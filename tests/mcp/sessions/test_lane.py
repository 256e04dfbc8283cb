"""The resume lane: which routes it serves, and a resume looked at once whichever way it goes."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx
import pytest
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.routing import Mount, Route

from replaystore import ReplayBuffer
from replaystore.mcp import manager_of, streamable_http_app
from replaystore.mcp.sessions.lane import _lanes
from replaystore.mcp.sessions.manager import ReplaySessionManager
from tests.mcp._support import RawSession, served_in_loop

pytestmark = pytest.mark.anyio


class _Wrapped:
    """A route's endpoint wrapped as an authentication layer wraps it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


async def _plain(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("not called")


def test_only_a_routes_own_manager_app_first_on_its_exact_path_gets_a_lane() -> None:
    manager = ReplaySessionManager(Server("lane"), ReplayBuffer.from_url("memory://lanes"))
    direct = StreamableHTTPASGIApp(manager)
    assert _lanes([Route("/mcp", direct)]) == {"/mcp": manager}
    assert _lanes([Route("/other", _plain), Route("/mcp", direct)]) == {"/mcp": manager}
    # Each of these keeps the usual way: the router (or a wrapper) has a say first.
    assert _lanes([Route("/mcp", _Wrapped(direct))]) == {}
    assert _lanes([Route("/mcp", _plain, methods=["GET"]), Route("/mcp", direct)]) == {}
    assert _lanes([Route("/mcp", _plain, methods=["POST"]), Route("/mcp", direct)]) == {}
    assert _lanes([Mount("/mcp/", routes=[]), Route("/mcp", direct)]) == {"/mcp": manager}
    assert _lanes([Mount("", routes=[]), Route("/mcp", direct)]) == {}
    assert _lanes([Route("/s/{name}", direct)]) == {}
    other = StreamableHTTPASGIApp.__new__(StreamableHTTPASGIApp)
    other.session_manager = object()  # type: ignore[assignment]
    assert _lanes([Route("/mcp", other)]) == {}


def _app() -> Any:
    server = MCPServer("lane")

    @server.tool()
    async def countdown(ctx: Context, n: int) -> str:
        for i in range(n):
            await ctx.report_progress(i + 1, n)
        return f"done {n}"

    return streamable_http_app(server, ReplayBuffer.from_url(f"memory://lane-{uuid.uuid4().hex}"))


async def test_a_resume_is_looked_at_once_whether_answered_in_the_lane_or_not() -> None:
    """A finished stream's resume is answered by the lane; a live one (the GET stream)
    goes the usual way, marked so that the manager does not read the store again."""
    app = _app()
    async with served_in_loop(app) as port, httpx.AsyncClient(timeout=15) as http:
        manager = manager_of(app)
        looked: list[str] = []
        resume = manager._resume_from_store

        async def counted(head: Any, scope: Any, *args: Any) -> Any:
            if scope["method"] == "GET":
                looked.append(scope["path"])
            return await resume(head, scope, *args)

        manager._resume_from_store = counted  # type: ignore[method-assign]
        session = await RawSession(http, f"http://127.0.0.1:{port}/mcp").initialize()
        ids: list[str] = []
        _, call = session.call("countdown", {"n": 3}, token="t")
        async with session.post(call) as response:
            async for line in response.aiter_lines():
                if line.startswith("id:"):
                    ids.append(line[3:].strip())
        async with session.get(ids[1]) as resumed:
            assert resumed.status_code == 200
            assert "done 3" in (await resumed.aread()).decode()
        assert len(looked) == 1
        with anyio.fail_after(10):
            async with session.get() as live:  # the session's GET stream: it stays open
                assert live.status_code == 200
                first = await anext(live.aiter_lines())
        assert first.startswith("id:")  # the GET stream's priming event
        looked.clear()
        with anyio.move_on_after(1):
            async with session.get(first[3:].strip()) as again:
                assert again.status_code == 200
        assert looked == ["/mcp"]  # read once: the usual path did not look again

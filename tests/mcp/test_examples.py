"""The examples in ``examples/`` stay runnable: serve each and call its tool with the SDK client."""

from __future__ import annotations

import runpy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.applications import Starlette
from starlette.routing import Route

from replaystore import ReplayBuffer
from replaystore.mcp import CountingObserver, ReplaySessionManager
from replaystore.testing.servers import find_free_port

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(params=["sdk_server.py", "fastmcp_server.py"])
def example_url(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    namespace = runpy.run_path(str(EXAMPLES / request.param), run_name="example")
    port = find_free_port()
    server = uvicorn.Server(
        uvicorn.Config(namespace["app"], host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "example did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/mcp", namespace["app"]
    finally:
        server.should_exit = True
        thread.join(10)


async def test_example_serves_resumable_sessions(example_url: tuple[str, Any]) -> None:
    url, app = example_url
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("countdown", {"n": 3}, progress_callback=on_progress)
    assert result.content[0].text == "done 3"  # type: ignore[union-attr]
    assert progress == [1.0, 2.0, 3.0]
    managers = [
        getattr(getattr(route, "endpoint", None), "session_manager", None) for route in app.routes
    ]
    assert any(isinstance(m, ReplaySessionManager) for m in managers)


async def test_hand_built_starlette_app_with_replay_session_manager() -> None:
    """``ReplaySessionManager`` mounted by hand, the way the SDK documents its own manager."""
    server = MCPServer("hand-built")

    @server.tool()
    async def countdown(ctx: Context, n: int) -> str:
        for i in range(n):
            await ctx.report_progress(i + 1, n)
            if i == 0:
                await ctx.close_sse_stream()
        return f"done {n}"

    observer = CountingObserver()
    manager = ReplaySessionManager(
        server, ReplayBuffer.from_url("memory://"), observer=observer, retry_interval=50
    )
    app = Starlette(
        routes=[Route("/mcp", StreamableHTTPASGIApp(manager))], lifespan=lambda app: manager.run()
    )
    port = find_free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        while not uv.started:
            assert thread.is_alive()
            await anyio.sleep(0.02)
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        url = f"http://127.0.0.1:{port}/mcp"
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            result = await s.call_tool("countdown", {"n": 4}, progress_callback=on_progress)
        assert result.content[0].text == "done 4"  # type: ignore[union-attr]
        assert progress == [1.0, 2.0, 3.0, 4.0]
        assert observer.verdicts["resumed"] >= 1
    finally:
        uv.should_exit = True
        thread.join(10)

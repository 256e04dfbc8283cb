"""The wiring's process options and ``manager_of``: a clear error for what cannot work."""

from __future__ import annotations

import inspect
import math
from typing import Any

import anyio
import pytest
from fastmcp import FastMCP
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette

from replaystore import ReplayBuffer
from replaystore.mcp import ReplaySessionManager, fastmcp_http_app, manager_of, streamable_http_app


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("drain_seconds", -1, "drain_seconds must be 0 to 3600"),
        ("drain_seconds", math.nan, "drain_seconds must be 0 to 3600"),
        ("collector_threshold", 0, "collector_threshold must be at least 1"),
        ("log_record_limit", 0, "log_record_limit must be at least 1"),
    ],
)
def test_an_option_out_of_range_is_refused_when_the_app_is_built(
    option: str, value: Any, says: str
) -> None:
    for build, server in ((streamable_http_app, MCPServer("x")), (fastmcp_http_app, FastMCP("x"))):
        with pytest.raises(ValueError, match=says):
            build(server, ReplayBuffer.from_url("memory://"), **{option: value})


def test_manager_of_names_what_it_was_given() -> None:
    app = streamable_http_app(MCPServer("x"), ReplayBuffer.from_url("memory://"), drain_seconds=0)
    assert isinstance(manager_of(app), ReplaySessionManager)
    with pytest.raises(TypeError, match="not an app built by"):
        manager_of(Starlette())
    # FastMCP builds its session manager when the app starts.
    with pytest.raises(RuntimeError, match="has not started"):
        manager_of(fastmcp_http_app(FastMCP("x"), ReplayBuffer.from_url("memory://")))


def test_both_app_builders_take_the_same_options() -> None:
    """One signature: what one builder takes, the other takes too (the server aside)."""
    sdk = inspect.signature(streamable_http_app).parameters
    fast = inspect.signature(fastmcp_http_app).parameters
    assert list(sdk) == list(fast)
    assert "close_buffer" in fast
    for name, parameter in sdk.items():
        assert fast[name].default == parameter.default, name


class _Closing(ReplayBuffer):
    """A memory buffer that counts how often the app closed it."""

    closed = 0

    async def aclose(self) -> None:
        self.closed += 1
        await super().aclose()


@pytest.mark.parametrize("kind", ["sdk", "fastmcp"])
def test_either_app_closes_its_buffer_when_told(kind: str) -> None:
    for close in (True, False):
        buffer = _Closing(ReplayBuffer.from_url("memory://").backend)
        options: dict[str, Any] = {"close_buffer": close, "check_store": False}
        if kind == "sdk":
            app = streamable_http_app(MCPServer("x"), buffer, **options)
        else:
            app = fastmcp_http_app(FastMCP("x"), buffer, **options)

        async def run(app: Any = app) -> None:
            async with app.router.lifespan_context(app):
                pass

        anyio.run(run)
        assert buffer.closed == (1 if close else 0), (kind, close)

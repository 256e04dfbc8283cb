"""The wiring's process options and ``manager_of``: a clear error for what cannot work."""

from __future__ import annotations

import math
from typing import Any

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

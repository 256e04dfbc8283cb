"""MCP streamable HTTP resumption backed by a :class:`~replaystore.ReplayBuffer`.

Needs the ``mcp`` extra (``pip install 'replaystore[mcp]'``). Official SDK::

    from mcp.server.mcpserver import MCPServer
    from replaystore import ReplayBuffer
    from replaystore.mcp import streamable_http_app

    mcp = MCPServer("demo")
    app = streamable_http_app(mcp, ReplayBuffer.from_url("redis://localhost:6379/0"))

FastMCP 4::

    from fastmcp import FastMCP
    from replaystore.mcp import fastmcp_http_app

    app = fastmcp_http_app(FastMCP("demo"), ReplayBuffer.from_url("redis://localhost:6379/0"))

Processes (or apps) on one buffer URL are replicas of each other: any of
them serves any session, behind any load balancer. See ``docs/mcp.md`` for
what changes on the wire and why, and ``docs/deployment.md`` for replicas.
"""

from __future__ import annotations

from .fastmcp import fastmcp_http_app
from .manager import ReplaySessionManager, streamable_http_app
from .messages import GET_STREAM
from .metrics import STORAGE_ERROR, CountingObserver, PrometheusObserver, ResumptionObserver
from .replica import Replica
from .sdk import SDKCompatibilityError
from .store import ReplayEventStore, SessionEventStore
from .transport import ReplayTransport

__all__ = [
    "GET_STREAM",
    "STORAGE_ERROR",
    "CountingObserver",
    "PrometheusObserver",
    "ReplayEventStore",
    "ReplaySessionManager",
    "ReplayTransport",
    "Replica",
    "ResumptionObserver",
    "SDKCompatibilityError",
    "SessionEventStore",
    "fastmcp_http_app",
    "streamable_http_app",
]

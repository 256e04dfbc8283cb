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
what changes on the wire and why, ``docs/deployment.md`` for replicas, and
``docs/architecture.md`` for where each part lives.

The public API is what this package and its public subpackages export:
:mod:`replaystore.mcp.tasks` (durable tasks, 2026-07-28),
:mod:`replaystore.mcp.client` (the client side) and
:mod:`replaystore.mcp.fastmcp` (FastMCP's tasks). Importing this package
loads nothing of the tasks stack. Every other module is internal to the
package and may change between releases.
"""

from __future__ import annotations

from ._sdk.checked import SDKCompatibilityError
from .app import manager_of, streamable_http_app
from .fastmcp import fastmcp_http_app
from .http_head import http_protocol
from .metrics import STORAGE_ERROR, CountingObserver, PrometheusObserver, ResumptionObserver
from .process import tune_collector
from .request_state import StoreKeyRing
from .sessions.event_store import ReplayEventStore
from .sessions.manager import ReplaySessionManager
from .settings import Settings
from .subscriptions import StoreSubscriptionBus

__all__ = [
    "STORAGE_ERROR",
    "CountingObserver",
    "PrometheusObserver",
    "ReplayEventStore",
    "ReplaySessionManager",
    "ResumptionObserver",
    "SDKCompatibilityError",
    "Settings",
    "StoreKeyRing",
    "StoreSubscriptionBus",
    "fastmcp_http_app",
    "http_protocol",
    "manager_of",
    "streamable_http_app",
    "tune_collector",
]

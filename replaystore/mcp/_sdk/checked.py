"""Every private name of the MCP SDK and of FastMCP this package relies on, checked at import.

The official SDK offers no public way to store sessions elsewhere, to adopt a
session in another process, or to answer a resumption before the SSE response
starts, so :mod:`replaystore.mcp` overrides and reads a handful of private
methods and attributes. A renamed one would otherwise fail silently (a
resumption falling back to the SDK's empty 200, a session never adopted).
This module lists them all in one place and checks, when
:mod:`replaystore.mcp` is imported, that each still exists with the shape
used here; if one is missing, the import fails with
:class:`SDKCompatibilityError` naming the installed versions and the tested
ranges, instead of misbehaving at run time.

The methods :mod:`replaystore.mcp._sdk.overrides` replaces carry a digest of the
SDK's own source of each (``source``), and so do the FastMCP methods whose
behaviour a wrapper here depends on: the import does not check it (a
reworded upstream docstring must not stop a server), the test suite does, so
an upgrade that changes such a method fails the tests until the code here is
read again against the new one.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server import streamable_http_manager
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import EventMessage, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from ..._seams import Requirement, describe, missing
from ...errors import ReplayStoreError

__all__ = [
    "TESTED_FASTMCP",
    "TESTED_MCP",
    "Requirement",
    "SDKCompatibilityError",
    "changed_sources",
    "check",
    "check_server",
    "lowlevel_server",
    "requirements",
    "source_digest",
    "take_request_stream",
]

#: The SDK and FastMCP ranges this package is tested against (also pinned in
#: the package metadata).
TESTED_MCP = ">=2.3,<2.4"
TESTED_FASTMCP = ">=4.2,<4.3"


class SDKCompatibilityError(ReplayStoreError, ImportError):
    """The installed MCP SDK (or FastMCP) lacks a private name this package overrides.

    An :class:`ImportError` too: it is raised while :mod:`replaystore.mcp` is
    imported, where code that treats the MCP layer as optional looks for one.
    """


# How to get an object to look a name up on, per owner.
_OWNERS: dict[str, Callable[[], Any]] = {
    "StreamableHTTPSessionManager": lambda: StreamableHTTPSessionManager,
    "StreamableHTTPSessionManager()": lambda: StreamableHTTPSessionManager(app=object()),  # type: ignore[arg-type]
    "StreamableHTTPServerTransport": lambda: StreamableHTTPServerTransport,
    "StreamableHTTPServerTransport()": lambda: StreamableHTTPServerTransport(mcp_session_id=None),
    "StreamableHTTPServerTransport.__init__": lambda: StreamableHTTPServerTransport.__init__,
    "JSONRPCDispatcher": lambda: JSONRPCDispatcher,
    "JSONRPCDispatcher()": lambda: JSONRPCDispatcher(None, None),  # type: ignore[arg-type]
    "Connection.for_loop": lambda: Connection.for_loop,
    "serve_connection": lambda: serve_connection,
    "streamable_http_manager": lambda: streamable_http_manager,
    "FastMCPRequestContext": lambda: _fastmcp_request_context(),
    "FastMCPContext": lambda: _fastmcp_context(),
    "RequestStateBoundary()": lambda: _boundary(),
    "FastMCP()": lambda: _fastmcp_server(),
}


def _boundary() -> Any:
    from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity

    return RequestStateBoundary(RequestStateSecurity.ephemeral(), default_audience=None)


def _fastmcp_server() -> Any:
    from fastmcp import FastMCP

    return FastMCP("replaystore-sdk-check")


def _fastmcp_context() -> Any:
    from fastmcp.server.context import Context

    return Context


def _fastmcp_request_context() -> Any:
    from fastmcp.server.dependencies import FastMCPRequestContext

    return FastMCPRequestContext


_REQUIREMENTS: tuple[Requirement, ...] = (
    # The session manager: admission, discard, adoption of a session known to the store.
    Requirement(
        "StreamableHTTPSessionManager",
        "_admit_session",
        "method",
        "builds each session's transport with its own view, before anything is stored",
        source="be70a49c7998add8",
    ),
    Requirement(
        "StreamableHTTPSessionManager",
        "_discard_session",
        "method",
        "forgets a session in this process only",
        source="29912d64573817be",
    ),
    Requirement(
        "StreamableHTTPSessionManager",
        "_handle_stateful_request",
        "method",
        "adopts a session the store knows before the SDK answers 404",
        source="aaa548f3ce29008d",
    ),
    Requirement(
        "StreamableHTTPSessionManager",
        "_serve_opening_request",
        "method",
        "runs the session loop with replica-unique server request ids",
        source="6940e25a2a3a1586",
    ),
    Requirement(
        "streamable_http_manager",
        "_send_and_report_status",
        "method",
        "the SDK's status check of a session's opening request, called as it is",
    ),
    Requirement(
        "StreamableHTTPSessionManager()",
        "_server_instances",
        "attribute",
        "the process's session table, where adopted sessions are registered",
    ),
    Requirement(
        "StreamableHTTPSessionManager()",
        "_session_owners",
        "attribute",
        "the credential that created each session",
    ),
    Requirement(
        "StreamableHTTPSessionManager()", "_task_group", "attribute", "where session loops run"
    ),
    Requirement(
        "StreamableHTTPSessionManager()",
        "_lifespan_state",
        "attribute",
        "handed to every session loop",
    ),
    Requirement(
        "StreamableHTTPSessionManager()",
        "_session_creation_lock",
        "attribute",
        "serializes admission, as the SDK does",
    ),
    # The transport: resumption answered before the SSE response starts.
    Requirement(
        "StreamableHTTPServerTransport",
        "_handle_get_request",
        "method",
        "plain GETs attach through the store",
        source="4169e339c24ca1d7",
    ),
    Requirement(
        "StreamableHTTPServerTransport",
        "_handle_post_request",
        "method",
        "client answers to another replica's requests are forwarded there",
        source="cc4f2cd0c9e317a2",
    ),
    Requirement(
        "StreamableHTTPServerTransport",
        "_handle_delete_request",
        "method",
        "DELETE ends the session on every replica",
        source="5cfabc881b4aa344",
    ),
    Requirement(
        "StreamableHTTPServerTransport",
        "_replay_events",
        "method",
        "GET + Last-Event-ID resolves before answering (404 on a failed verdict)",
        source="fc5d049793525733",
    ),
    Requirement(
        "StreamableHTTPServerTransport",
        "_validate_request_headers",
        "method",
        "the SDK's own header checks, kept for plain GETs",
    ),
    Requirement(
        "StreamableHTTPServerTransport",
        "_create_event_data",
        "method",
        "the SDK's SSE framing of a message",
    ),
    Requirement(
        "StreamableHTTPServerTransport()",
        "_request_streams",
        "attribute",
        "a request answered with the store's refusal in its open stream leaves the routing",
    ),
    Requirement(
        "StreamableHTTPServerTransport()",
        "_retry_interval",
        "attribute",
        "sent with priming events",
    ),
    Requirement(
        "StreamableHTTPServerTransport()",
        "_read_stream_writer",
        "attribute",
        "where forwarded client messages enter the session loop",
    ),
    Requirement(
        "StreamableHTTPServerTransport.__init__",
        "idle_timeout",
        "parameter",
        "each session's transport is built here with the manager's settings",
    ),
    Requirement(
        "StreamableHTTPServerTransport.__init__",
        "retry_interval",
        "parameter",
        "each session's transport is built here with the manager's settings",
    ),
    # The session loop: a connection rebuilt in its initialized state.
    Requirement(
        "JSONRPCDispatcher",
        "_allocate_id",
        "method",
        "server-to-client request ids name the replica that sent them",
        source="a6f0d6f2cb32f4ff",
    ),
    Requirement(
        "JSONRPCDispatcher()",
        "_tg",
        "attribute",
        "the loop's task group, cancelled from a callback as a failed resume ends the session",
    ),
    Requirement(
        "Connection.for_loop",
        "session_id",
        "parameter",
        "an adopted session's loop is built like the SDK's",
    ),
    Requirement(
        "serve_connection", "lifespan_state", "parameter", "drives an adopted session's loop"
    ),
    # MCPServer (checked on the server object given, when it is not a low-level Server).
    Requirement(
        "MCPServer()",
        "_lowlevel_server",
        "attribute",
        "the low-level Server an MCPServer wraps, which the session manager drives",
    ),
    # What replicas share (mcp/app.py): the request-state policy and the listen bus.
    Requirement(
        "RequestStateBoundary()",
        "_security",
        "attribute",
        "the policy a server seals requestState with, replaced by one every replica shares",
    ),
    Requirement(
        "MCPServer()",
        "_subscriptions",
        "attribute",
        "the bus ctx.notify_* publishes to, replaced by one every replica shares",
    ),
    # FastMCP (checked only when it is installed).
    Requirement(
        "FastMCP()",
        "_mcp_server",
        "attribute",
        "the low-level server whose request-state boundary is replaced",
    ),
    Requirement(
        "FastMCP()",
        "_request_state_security",
        "attribute",
        "tells a policy the application gave from FastMCP's per-process default",
    ),
    Requirement(
        "FastMCPRequestContext",
        "_srctx",
        "parameter",
        "the SDK request context behind FastMCP's (a listen stream's subscription id is the "
        "JSON-RPC id as sent; a tool running as a task gets it with the task's session)",
    ),
    # FastMCP's ctx.elicit in a tool running as a task (fastmcp_tasks._TaskContext): FastMCP
    # refuses it on 2026-07-28 by the request context's protocol version, which the task
    # context sets for the call. Reviewed against these sources (the tests compare digests).
    Requirement(
        "FastMCPContext",
        "elicit",
        "method",
        "wrapped for tools running as tasks; refuses only through _is_modern_protocol",
        source="6d41b487501ff3e0",
    ),
    Requirement(
        "FastMCPContext",
        "_is_modern_protocol",
        "method",
        "FastMCP's era check before elicit: reads the request context's protocol version",
        source="ac5a97927d3b5810",
    ),
)


def requirements() -> tuple[Requirement, ...]:
    """Every private SDK name used by :mod:`replaystore.mcp`."""
    return _REQUIREMENTS


def source_digest(obj: Any) -> str:
    """A short digest of the source of ``obj``: it changes when its code or comments change."""
    return hashlib.sha256(inspect.getsource(obj).encode("utf-8")).hexdigest()[:16]


def changed_sources(
    reqs: Iterable[Requirement] | None = None,
    owners: dict[str, Callable[[], Any]] | None = None,
) -> list[str]:
    """The overridden methods whose upstream source differs from the one reviewed, with digests.

    Each entry reads ``"Owner.name: reviewed <digest>, installed <digest>"``.
    ``reqs`` and ``owners`` default to this package's own list.
    """
    lookup = _OWNERS if owners is None else {**_OWNERS, **owners}
    changed = []
    for r in _REQUIREMENTS if reqs is None else reqs:
        if not r.source:
            continue
        try:
            owner = lookup[r.owner]()
        except ImportError:  # an optional package (FastMCP) that is not installed
            continue
        installed = source_digest(getattr(owner, r.name))
        if installed != r.source:
            changed.append(f"{r.owner}.{r.name}: reviewed {r.source}, installed {installed}")
    return changed


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def check(
    reqs: Iterable[Requirement] | None = None,
    owners: dict[str, Callable[[], Any]] | None = None,
    *,
    fastmcp: bool = False,
) -> None:
    """Raise :class:`SDKCompatibilityError` unless every private name is there.

    FastMCP's names are checked only with ``fastmcp=True`` (by
    :func:`~replaystore.mcp.fastmcp_http_app`), so that SDK-only servers do
    not pay for importing FastMCP. ``reqs`` and ``owners`` default to this
    package's own list; tests pass others to see the check fail.
    """
    lookup = _OWNERS if owners is None else {**_OWNERS, **owners}
    if reqs is None:
        reqs = [
            r
            for r in _REQUIREMENTS
            if (fastmcp or not r.owner.startswith("FastMCP")) and r.owner != "MCPServer()"
        ]
    # FastMCP is optional: where it is not installed, nothing uses its names.
    gone = missing(reqs, lookup, optional=(ImportError,))
    if not gone:
        return
    listing = describe(gone)
    raise SDKCompatibilityError(
        f"replaystore.mcp does not support the installed MCP SDK (mcp {_version('mcp')}, "
        f"fastmcp {_version('fastmcp')}; tested: mcp {TESTED_MCP}, fastmcp {TESTED_FASTMCP}): "
        f"missing {listing}"
    )


def check_server(server: Any, name: str) -> None:
    """Check the private attribute ``name`` that an ``MCPServer`` (``server``) must have."""
    requirement = next(r for r in _REQUIREMENTS if r.owner == "MCPServer()" and r.name == name)
    check([requirement], owners={"MCPServer()": lambda: server})


def lowlevel_server(app: Any) -> Any:
    """The low-level ``Server`` behind ``app`` (itself, or what an ``MCPServer`` wraps)."""
    from mcp.server.lowlevel.server import Server

    if isinstance(app, Server):
        return app
    requirement = next(r for r in _REQUIREMENTS if r.owner == "MCPServer()")
    check([requirement], owners={"MCPServer()": lambda: app})
    return app._lowlevel_server


def take_request_stream(
    transport: StreamableHTTPServerTransport, stream: str
) -> tuple[MemoryObjectSendStream[EventMessage], MemoryObjectReceiveStream[EventMessage]] | None:
    """Take the channel of request ``stream`` out of the transport's routing (None if absent).

    What the transport routes to the request afterwards is dropped, and its
    teardown no longer closes the channel: the caller ends it.
    """
    return transport._request_streams.pop(stream, None)


check()

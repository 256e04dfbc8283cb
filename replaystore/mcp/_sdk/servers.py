"""The private attributes of SDK and FastMCP objects that the app wiring reads or replaces.

Sharing a server's ``requestState`` policy and listen bus between replicas,
and serving FastMCP through the SDK's handlers, needs a few names that
neither package makes public. Each is listed, with why, in
:mod:`replaystore.mcp._sdk.checked` (checked when :mod:`replaystore.mcp` is
imported; FastMCP's when a FastMCP app is built), and each is reached here
only, by one function, so that an upgrade renaming one breaks here, loudly.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.request_state import RequestStateSecurity
from mcp.server.subscriptions import SubscriptionBus

from .checked import check_server

__all__ = [
    "boundary_security",
    "fastmcp_lowlevel",
    "fastmcp_own_request_state",
    "lifespan_state",
    "replace_subscriptions",
    "sdk_request_context",
    "subscriptions_of",
]


def fastmcp_lowlevel(server: Any) -> Any:
    """The low-level ``Server`` a ``FastMCP`` server drives (``FastMCP()._mcp_server``)."""
    return server._mcp_server


def fastmcp_own_request_state(server: Any) -> bool:
    """Whether the application gave a ``FastMCP`` server a ``request_state_security`` of its own.

    FastMCP keeps the one given apart from its per-process default
    (``FastMCP()._request_state_security``).
    """
    return getattr(server, "_request_state_security", None) is not None


def boundary_security(boundary: Any) -> RequestStateSecurity | None:
    """The policy a ``RequestStateBoundary`` seals with (``RequestStateBoundary()._security``)."""
    security = getattr(boundary, "_security", None)
    return security if isinstance(security, RequestStateSecurity) else None


def subscriptions_of(server: Any) -> SubscriptionBus | None:
    """The bus an ``MCPServer``'s ``ctx.notify_*`` publishes to (``MCPServer()._subscriptions``)."""
    check_server(server, "_subscriptions")
    bus: SubscriptionBus | None = server._subscriptions
    return bus


def replace_subscriptions(server: Any, bus: SubscriptionBus) -> None:
    """Make ``bus`` the one an ``MCPServer``'s ``ctx.notify_*`` publishes to."""
    check_server(server, "_subscriptions")
    server._subscriptions = bus


def lifespan_state(manager: Any) -> Any:
    """What a session manager hands every session loop (``_lifespan_state``): the server's."""
    return manager._lifespan_state


def sdk_request_context(request: Any) -> ServerRequestContext[Any, Any] | None:
    """The SDK request context behind FastMCP's (``FastMCPRequestContext._srctx``), if any.

    FastMCP documents it as its escape hatch to the SDK's context.
    """
    context = getattr(request, "_srctx", None)
    return context if isinstance(context, ServerRequestContext) else None

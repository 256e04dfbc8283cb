"""``subscriptions/listen`` on FastMCP 4, which answers it with -32601 on its own.

Loaded by every FastMCP app that serves listen streams (the default), with
or without tasks: nothing here imports the tasks stack.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    DiscoverResult,
    ServerCapabilities,
    SubscriptionsListenRequestParams,
)
from pydantic import ValidationError

from .._sdk.servers import sdk_request_context

__all__ = ["ListenMiddleware"]


class ListenMiddleware(Middleware):
    """Serves ``subscriptions/listen`` on FastMCP with the SDK's listen handler.

    FastMCP 4.2 answers ``subscriptions/listen`` with -32601, and an
    extension may not bind a spec method; its middleware, though, sees every
    request before the method is routed. So this middleware answers listen
    requests itself (the same handler, hence the same stream, as on an
    ``MCPServer``) and passes every other request on.
    :func:`~replaystore.mcp.fastmcp_http_app` adds it (the SDK's
    ``ListenHandler`` over the shared bus, or with ``tasks=``
    :class:`~replaystore.mcp.tasks.listen.TaskListenHandler`) unless
    ``share=False`` and no bus is given.

    It also corrects ``server/discover``: at 2026-07-28, change
    notifications travel on listen streams only, so (as the SDK derives it)
    ``listChanged`` of tools, prompts and resources and ``resources.subscribe``
    say whether ``subscriptions/listen`` is served. FastMCP looks for its own
    handler of the method, finds none and says false; with this middleware
    they are true, as on an ``MCPServer`` replica of the same deployment.
    """

    def __init__(
        self,
        handler: Callable[
            [ServerRequestContext[Any, Any], SubscriptionsListenRequestParams], Awaitable[Any]
        ],
    ) -> None:
        self.handler = handler

    async def on_request(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        fastmcp_context = context.fastmcp_context
        wrapper = None if fastmcp_context is None else fastmcp_context.request_context
        # FastMCP's own request context gives the request id as a string; the
        # subscription id must be the JSON-RPC id as sent, so the handler gets
        # the SDK context FastMCP keeps behind it (its documented escape hatch).
        request = sdk_request_context(wrapper)
        if context.method != "subscriptions/listen" or request is None:
            return await call_next(context)
        try:
            params = SubscriptionsListenRequestParams.model_validate(context.message)
        except ValidationError as exc:
            raise MCPError(INVALID_PARAMS, f"invalid subscriptions/listen params: {exc}") from exc
        return await self.handler(request, params)

    async def on_discover(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        result = await call_next(context)
        if not isinstance(result, DiscoverResult):
            return result  # another extension's result type: not ours to change
        return result.model_copy(update={"capabilities": _listening(result.capabilities)})


def _listening(capabilities: ServerCapabilities) -> ServerCapabilities:
    """``capabilities`` of a server that serves ``subscriptions/listen`` (2026-07-28)."""
    update: dict[str, Any] = {}
    if capabilities.tools is not None:
        update["tools"] = capabilities.tools.model_copy(update={"list_changed": True})
    if capabilities.prompts is not None:
        update["prompts"] = capabilities.prompts.model_copy(update={"list_changed": True})
    if capabilities.resources is not None:
        update["resources"] = capabilities.resources.model_copy(
            update={"list_changed": True, "subscribe": True}
        )
    return capabilities.model_copy(update=update)

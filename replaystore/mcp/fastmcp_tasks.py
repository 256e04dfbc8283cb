"""Durable tasks for FastMCP 4, through FastMCP's own extension point.

FastMCP has its own ``ServerExtension`` (method bindings, a ``tools/call``
interceptor that sits after its middleware, and a lifespan), distinct from the
official SDK's. :class:`FastMCPTasks` puts a
:class:`~replaystore.mcp.tasks.ReplayTasks` behind it, so a FastMCP server
gets the very same tasks (records, leases, cancellation, ``tasks/*``) as an
``MCPServer``, and both kinds of replica can share one store.
:func:`~replaystore.mcp.fastmcp_http_app` registers it when given ``tasks=``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any

from fastmcp.exceptions import FastMCPError
from fastmcp.server.context import Context
from fastmcp.server.extensions import MethodBinding, ServerExtension, ToolCallContinuation
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    SubscriptionsListenRequestParams,
    TextContent,
)
from pydantic import BaseModel, ValidationError

from .task_listen import TaskListenHandler
from .tasks import EXTENSION, ReplayTasks

__all__ = ["FastMCPTasks", "ListenMiddleware"]


# Set while a survivor runs a task's stored call again, so the interceptor lets
# that call through to the tool instead of making it a task of its own.
_rerunning: ContextVar[bool] = ContextVar("replaystore_task_rerun", default=False)


class _Created(BaseModel, extra="allow"):
    """The ``CreateTaskResult`` as FastMCP hands an interceptor's result to the SDK runner."""


class FastMCPTasks(ServerExtension):
    """``ReplayTasks`` as a FastMCP ``ServerExtension``: ``mcp.add_extension(FastMCPTasks(tasks))``.

    Bind ``tasks`` to a buffer and serve inside ``async with tasks.running():``
    (``fastmcp_http_app`` does both). The runner is not tied to FastMCP's
    extension lifespan, which FastMCP may enter and leave in different
    tasks, where a task group cannot live.
    """

    identifier = EXTENSION

    def __init__(self, tasks: ReplayTasks) -> None:
        self.tasks = tasks
        tasks.rerun_with(self._rerun)

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding(b.method, b.params_type, b.handler, b.protocol_versions)
            for b in self.tasks.methods()
        ]

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        context: Context,
        call_next: ToolCallContinuation,
    ) -> Any:
        request = context.request_context
        if _rerunning.get():  # a task's own run again: the tool itself
            return await call_next()
        support = None if request is None else self.tasks.task_support(params.name, request)
        if support is None:
            return await call_next()

        async def body(_run: Any) -> CallToolResult:
            return await _tool_result(call_next)

        return _Created(**await self.tasks.start(support, request, body, params))

    async def _rerun(
        self, name: str, arguments: dict[str, Any], _run: Any, _ctx: Any
    ) -> CallToolResult:
        """Run a stored call again through the server (its middleware included), not as a task."""
        token = _rerunning.set(True)
        try:
            return await _tool_result(lambda: self.server.call_tool(name, arguments))
        finally:
            _rerunning.reset(token)


class ListenMiddleware(Middleware):
    """Serves ``subscriptions/listen`` on FastMCP with a :class:`TaskListenHandler`.

    FastMCP 4.2 answers ``subscriptions/listen`` with -32601, and an
    extension may not bind a spec method; its middleware, though, sees every
    request before the method is routed. So this middleware answers listen
    requests itself (the same handler, hence the same stream, as on an
    ``MCPServer``) and passes every other request on.
    :func:`~replaystore.mcp.fastmcp_http_app` adds it when given both
    ``tasks=`` and ``subscriptions=``.
    """

    def __init__(self, handler: TaskListenHandler) -> None:
        self.handler = handler

    async def on_request(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        fastmcp_context = context.fastmcp_context
        wrapper = None if fastmcp_context is None else fastmcp_context.request_context
        # FastMCP's own request context gives the request id as a string; the
        # subscription id must be the JSON-RPC id as sent, so the handler gets
        # the SDK context FastMCP keeps behind it (its documented escape hatch).
        request = getattr(wrapper, "_srctx", None)
        if context.method != "subscriptions/listen" or not isinstance(
            request, ServerRequestContext
        ):
            return await call_next(context)
        try:
            params = SubscriptionsListenRequestParams.model_validate(context.message)
        except ValidationError as exc:
            raise MCPError(INVALID_PARAMS, f"invalid subscriptions/listen params: {exc}") from exc
        return await self.handler(request, params)


async def _tool_result(call: Callable[[], Awaitable[Any]]) -> CallToolResult:
    """The tool's outcome as the ``CallToolResult`` a plain call would answer."""
    try:
        result = await call()
    except FastMCPError as exc:
        # What FastMCP answers a plain call whose tool raised ToolError.
        return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
    if isinstance(result, ToolResult):
        return CallToolResult(
            content=result.content,
            structured_content=result.structured_content,
            is_error=result.is_error,
            _meta=result.meta,
        )
    raise TypeError(f"a task tool returned {type(result).__name__}, not a tool result")

"""Durable tasks for FastMCP 4, through FastMCP's own extension point.

FastMCP has its own ``ServerExtension`` (method bindings, a ``tools/call``
interceptor that sits after its middleware, and a lifespan), distinct from the
official SDK's. :class:`FastMCPTasks` puts a
:class:`~replaystore.mcp.tasks.ReplayTasks` behind it, so a FastMCP server
gets the very same tasks (records, leases, cancellation, input requests,
``tasks/*``) as an ``MCPServer``, and both kinds of replica can share one
store. :func:`~replaystore.mcp.fastmcp_http_app` registers it when given
``tasks=``, with :class:`TaskContexts` (input from FastMCP's ``ctx.elicit``);
its listen streams then carry ``notifications.taskIds`` too
(:class:`~replaystore.mcp.fastmcp.listen.ListenMiddleware`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

from fastmcp import FastMCP
from fastmcp.exceptions import FastMCPError
from fastmcp.server.context import Context
from fastmcp.server.dependencies import bind_request_context, fastmcp_request_ctx, get_context
from fastmcp.server.extensions import MethodBinding, ServerExtension, ToolCallContinuation
from fastmcp.server.transforms import GetToolNext, Transform
from fastmcp.tools.base import Tool, ToolResult
from fastmcp.utilities.versions import VersionSpec
from mcp.server.context import ServerRequestContext
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    TextContent,
)
from mcp_types.version import LATEST_HANDSHAKE_VERSION
from pydantic import BaseModel

from .._sdk.servers import sdk_request_context
from ..tasks.extension import EXTENSION, ReplayTasks, TaskSession

__all__ = ["FastMCPTasks", "TaskContexts"]


# Set while a survivor runs a task's stored call again, so the interceptor lets
# that call through to the tool instead of making it a task of its own.
_rerunning: ContextVar[bool] = ContextVar("replaystore_task_rerun", default=False)


class _Created(BaseModel, extra="allow"):
    """The ``CreateTaskResult`` as FastMCP hands an interceptor's result to the SDK runner."""


class FastMCPTasks(ServerExtension):
    """``ReplayTasks`` as a FastMCP ``ServerExtension``: ``mcp.add_extension(FastMCPTasks(tasks))``.

    Bind ``tasks`` to a buffer and serve inside ``async with tasks.running():``
    (``fastmcp_http_app`` does both, and adds :class:`TaskContexts` so that
    ``ctx.elicit`` works in task tools). The runner is not tied to FastMCP's
    extension lifespan, which FastMCP may enter and leave in different
    tasks, where a task group cannot live.

    A tool running as a task sees the task's session (through FastMCP's
    request context): its server-to-client requests become the task's
    ``inputRequests``, its progress and log notifications are dropped.
    """

    identifier = EXTENSION

    def __init__(self, tasks: ReplayTasks) -> None:
        self.tasks = tasks
        tasks.rerun_with(self._rerun)

    def settings(self) -> dict[str, Any]:
        return self.tasks.settings()

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
        if support is None or request is None:
            return await call_next()
        # FastMCP's request context wraps the SDK's (its documented escape hatch).
        sdk_request = sdk_request_context(request)

        async def body(run: Any) -> CallToolResult:
            with self._task_request(run, sdk_request, params.name, params.arguments or {}):
                return await _tool_result(call_next)

        return _Created(**await self.tasks.start(support, request, body, params))

    async def _rerun(
        self, name: str, arguments: dict[str, Any], run: Any, ctx: Any
    ) -> CallToolResult:
        """Run a stored call again through the server (its middleware included), not as a task.

        ``ctx`` is the SDK request context of the read that claimed the task,
        or None when the background scan did; the tool gets the task's
        session, as on its first run.
        """
        token = _rerunning.set(True)
        try:
            with self._task_request(run, ctx, name, arguments):
                return await _tool_result(lambda: self.server.call_tool(name, arguments))
        finally:
            _rerunning.reset(token)

    @contextmanager
    def _task_request(
        self,
        run: Any,
        request: ServerRequestContext[Any, Any] | None,
        name: str,
        arguments: dict[str, Any],
    ) -> Iterator[None]:
        """FastMCP's request context for the tool of ``run``: the task's session, no SSE stream."""
        with bind_request_context(self.tasks.run_context(run, request, name, arguments)):
            yield


async def tool_names(server: FastMCP) -> set[str]:
    """The tools ``server`` defines, its mounted servers' included, whoever asks.

    The providers' listing (``FastMCP.list_tools`` filters by the caller's
    authorization, and there is no caller here), plus the listing after
    transforms, which may rename tools.
    """
    defined = {tool.name for tool in await super(FastMCP, server).list_tools()}
    listed = await server.list_tools(run_middleware=False)
    return defined | {tool.name for tool in listed}


class _TaskContext(Context):
    """FastMCP's ``Context`` of a tool running as a task: ``elicit`` asks through the task.

    FastMCP refuses ``ctx.elicit`` on a 2026-07-28 request before anything is
    sent: it reads the request's protocol version, and that revision has no
    channel for server-initiated requests. A task has one, its input
    requests, so for the length of this one call FastMCP's request context
    names the newest handshake revision (the task's session, the request id
    and everything else unchanged), and FastMCP's own ``elicit`` runs: its
    schema, its ``elicitation/create`` request (which the task's session
    turns into an input request), its reading of the answer.
    """

    async def elicit(self, *args: Any, **kwargs: Any) -> Any:
        request = fastmcp_request_ctx.get()
        if request is None or not isinstance(request.session, TaskSession):
            return await super().elicit(*args, **kwargs)
        token = fastmcp_request_ctx.set(replace(request, protocol_version=LATEST_HANDSHAKE_VERSION))
        try:
            return await super().elicit(*args, **kwargs)
        finally:
            fastmcp_request_ctx.reset(token)


class TaskContexts(Transform):
    """Gives a FastMCP tool running as a task a ``Context`` whose ``elicit`` works.

    FastMCP builds a new ``Context`` for every tool run and has no hook to
    choose its class; the first thing it does with that ``Context`` current
    is to look the tool up, through the server's transforms. So this
    transform passes every lookup through unchanged and, when the lookup
    runs for a tool running as a task (FastMCP's request context carries the
    task's session), makes that ``Context`` a task context (see
    ``_TaskContext``). Other ``Context`` objects, and every listing, are left
    alone. Add it with ``mcp.add_transform(TaskContexts())`` next to
    :class:`FastMCPTasks` (``fastmcp_http_app`` does).
    """

    async def get_tool(
        self, name: str, call_next: GetToolNext, *, version: VersionSpec | None = None
    ) -> Tool | None:
        tool = await call_next(name, version=version)
        request = fastmcp_request_ctx.get()
        if request is not None and isinstance(request.session, TaskSession):
            try:
                context = get_context()
            except RuntimeError:  # no tool run under way
                return tool
            if type(context) is Context:
                context.__class__ = _TaskContext
        return tool


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

"""What a tool running as a task sees, under the official SDK.

A task's tool runs detached from the request that created it, possibly on
another replica, possibly again after its first runner died. This module
holds what makes that look like an ordinary call to the tool: the session
it talks through (:class:`TaskSession`, which turns a server-to-client
request into an input request of the task), the principal a task belongs to
(:func:`default_owner`), and how an ``MCPServer`` runs a stored call again
(:func:`sdk_rerun`). The runner (:mod:`~replaystore.mcp.tasks.runner`) is
what the session asks through; the extension hands each run its session.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

import anyio
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent
from mcp_types.version import LATEST_MODERN_VERSION
from pydantic import BaseModel

from ...errors import StorageError
from ...taskstore.events import event_blob
from ...taskstore.records import TaskInputError
from ...taskstore.sep2694 import PROGRESS_TYPE
from .leases import Run
from .runner import Rerun, TaskRunner

__all__ = ["TaskSession", "default_owner", "run_context", "sdk_rerun", "sdk_tool_names"]

logger = logging.getLogger("replaystore.mcp.tasks")


class TaskSession(ServerSession):
    """The tool's session inside a task: server-to-client requests become input requests.

    Everything else is the request's own session (reached through
    ``__getattr__``, so no SDK attribute is named here). Progress the tool
    reports becomes a task event (``tasks/stream`` carries it; the tasks
    extension itself carries no progress); log notifications are dropped.
    """

    def __init__(self, inner: ServerSession | None, tasks: TaskRunner, run: Run) -> None:
        # The SDK's constructor is not called: this object only redirects.
        # ``inner`` is None for a run started by the background scan: no
        # client request is behind it, so the client's details are unknown.
        self._replay_inner = inner
        self._replay_tasks = tasks
        self._replay_run = run

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__["_replay_inner"]
        if inner is None:
            if name in ("client_params", "client_capabilities"):
                return None
            raise AttributeError(
                f"{name!r} is not available to a task run again in the background: "
                "no client request is behind it"
            )
        return getattr(inner, name)

    async def send_request(
        self, request: BaseModel, result_type: type[BaseModel], *args: Any, **kwargs: Any
    ) -> Any:
        wire = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        answer = await self._replay_tasks.ask(self._replay_run, wire)
        return result_type.model_validate(answer, by_name=False)

    async def emit_event(self, event_type: str, payload: Mapping[str, Any]) -> int:
        """Store an event of this task (see :func:`~replaystore.mcp.tasks.emit_event`).

        A store that stalls or cannot be reached is waited for as long as the
        run holds its task, as its lease renewals wait (a stall alone never
        ends a task; the run is stopped if it loses the task meanwhile); only
        a refusal that waiting cannot cure (an ACL) raises at once. The
        append's key (one per append of this run) stores one sent again after
        a lost reply once, so waiting never stores an event twice.
        A run that no longer holds its task (ended, or run again elsewhere) stops.
        """
        tasks, run = self._replay_tasks, self._replay_run
        value = dict(payload) if isinstance(payload, Mapping) else payload  # else refused
        blob = event_blob(event_type, value, tasks.events)
        run.emitted += 1
        while True:
            try:
                seq = await tasks.store.emit(run.task_id, tasks.runner, blob, key=str(run.emitted))
                break
            except StorageError as exc:
                if exc.permanent:
                    raise
            await anyio.sleep(tasks.check_interval)
        if seq is None:
            run.ended = True
            run.scope.cancel()
            await anyio.sleep_forever()
        return seq or 0

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Progress as a task event; best effort, as progress is: a store error is logged only."""
        try:
            await self.emit_event(PROGRESS_TYPE, progress_payload(progress, total, message))
        except (StorageError, TaskInputError) as exc:
            logger.warning("task %s: progress not recorded: %s", self._replay_run.task_id, exc)

    async def send_progress_notification(
        self,
        progress_token: str | int,
        progress: float,
        total: float | None = None,
        message: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        await self.report_progress(progress, total, message)

    async def send_log_message(self, *args: Any, **kwargs: Any) -> None:
        return None


def default_owner() -> str | None:
    """The authenticated principal, or None without auth.

    The SDK's own definition of a token's principal (client id, issuer,
    subject: ``principal_components``), the one its session ownership uses:
    a token that could not take over another principal's session cannot
    read or cancel that principal's tasks either. A ``sub`` is unique only
    per issuer, so a token of another issuer with the same client id and
    subject is another owner.
    """
    try:
        from mcp.server.auth.middleware.auth_context import get_access_token
        from mcp.server.auth.provider import principal_components
    except ImportError:  # pragma: no cover - auth extras missing
        return None
    token = get_access_token()
    if token is None:
        return None
    return json.dumps(principal_components(token), separators=(",", ":"))


def sdk_tool_names(server: MCPServer) -> Callable[[], Awaitable[Collection[str]]]:
    """The names of the tools ``server`` defines, when asked (tools may be added after wiring)."""

    async def names() -> Collection[str]:
        return {tool.name for tool in await server.list_tools()}

    return names


def run_context(
    tasks: TaskRunner,
    run: Run,
    ctx: ServerRequestContext[Any, Any] | None,
    name: str,
    arguments: dict[str, Any],
) -> ServerRequestContext[Any, Any]:
    """The SDK request context a run of a task's tool (``name``, ``arguments``) sees.

    ``ctx`` with the task's session, no SSE stream; for a run the
    background scan started (``ctx`` None), a context with no client
    behind it: the task's session alone, the server's lifespan state.
    """
    if ctx is None:
        return ServerRequestContext(
            session=TaskSession(None, tasks, run),
            lifespan_context=tasks.lifespan_state,
            protocol_version=LATEST_MODERN_VERSION,
            method="tools/call",
            params={"name": name, "arguments": arguments},
        )
    return replace(ctx, session=TaskSession(ctx.session, tasks, run), close_sse_stream=None)


def sdk_rerun(tasks: TaskRunner, server: MCPServer) -> Rerun:
    """Run a stored call through ``MCPServer.call_tool``, as a ``tools/call`` would."""

    async def rerun(name: str, arguments: dict[str, Any], run: Run, ctx: Any) -> HandlerResult:
        task_ctx = run_context(tasks, run, ctx, name, arguments)
        try:
            result: HandlerResult = await server.call_tool(
                name, arguments, Context(request_context=task_ctx, mcp_server=server)
            )
        except MCPError:
            raise
        except Exception as exc:  # what the SDK answers a plain call whose tool raised
            logger.info("task %s: tool %r failed: %r", run.task_id, name, str(exc))
            text = TextContent(type="text", text=str(exc))
            return CallToolResult(content=[text], is_error=True)
        return result

    return rerun


def progress_payload(progress: float, total: float | None, message: str | None) -> dict[str, Any]:
    """The payload of a progress event: the fields of ``notifications/progress``."""
    payload: dict[str, Any] = {"progress": progress}
    if total is not None:
        payload["total"] = total
    if message is not None:
        payload["message"] = message
    return payload

"""Calling tools as durable tasks from a FastMCP ``Client`` (or the MCP SDK's own ``Client``).

A server speaking the tasks extension answers ``tools/call`` of a task tool
with a ``CreateTaskResult`` (``resultType: "task"``), not a
``CallToolResult``. The MCP SDK's client extensions let a client declare an
extension and *claim* such an extra result shape: the session parses it into
the claim's model and hands it to the claim's resolver, whose job is to turn
it into the ``CallToolResult`` the caller awaits. FastMCP 4.2's
``Client(extensions=[...])`` takes these extensions as they are.

:class:`ClientTasks` is that extension for ``io.modelcontextprotocol/tasks``:
it declares the extension (so tools marked ``optional`` become tasks and
``required`` ones are allowed), and resolves each ``CreateTaskResult`` by
polling ``tasks/get`` through the same session at the server's suggested
interval, answering input requests through a callback (each key once), until
the task ends. ``client.call_tool(...)`` then returns the task's result as
for a plain call, on any replica behind any balancer::

    async with Client(url, extensions=[ClientTasks(on_input=ask_user)]) as client:
        result = await client.call_tool("report", {"days": 7})

A task that ends ``failed`` or ``cancelled`` raises
:class:`~replaystore.mcp.client.TaskFailedError` or
:class:`~replaystore.mcp.client.TaskCancelledError` from ``call_tool``.
Claims apply on the 2026-07-28 protocol only (FastMCP negotiates it with
``server/discover`` by default); on a 2025-11-25 session tools run as plain
calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import anyio
import httpx2
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import BaseModel, ConfigDict

from .task_events import OnGone, TaskEventStream
from .tasks import (
    EXTENSION,
    CreatedHandler,
    InputHandler,
    TaskCancelledError,
    TaskClient,
    TaskError,
    TaskFailedError,
    run_on_created,
    tool_result,
)

__all__ = ["ClientTasks", "CreatedTask"]


class _Detailed(BaseModel):
    """A ``DetailedTask`` as the server sent it: every field kept, read as a mapping."""

    model_config = ConfigDict(extra="allow")


class CreatedTask(Result):
    """The ``CreateTaskResult`` of the tasks extension: the task, flattened into the result."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class _TaskParams(RequestParams):
    task_id: str


class _UpdateParams(RequestParams):
    task_id: str
    input_responses: dict[str, dict[str, Any]]


class _GetTask(Request[_TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskParams
    # The task id travels as ``Mcp-Name`` too, as the extension requires.
    name_param = "taskId"


class _UpdateTask(Request[_UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: _UpdateParams
    name_param = "taskId"


class ClientTasks(ClientExtension):
    """Declare the tasks extension and wait for the tasks ``tools/call`` creates.

    ``on_input(key, request)`` answers one input request (an
    ``elicitation/create`` request's answer is ``{"action": ..., "content":
    ...}``); without it a task that needs input raises :class:`TaskError`.
    ``on_created(task_id)`` (plain or async) runs once the server created
    the task, before polling starts: persist the id there to pick the task
    up after a restart (with :meth:`TaskClient.wait
    <replaystore.mcp.client.TaskClient.wait>`); if it raises, the call
    raises :class:`~replaystore.mcp.client.OnCreatedError` carrying the id.
    Polling waits at least ``min_poll`` and at most ``max_poll`` seconds,
    whatever the server suggests.
    """

    identifier = EXTENSION

    def __init__(
        self,
        *,
        on_input: InputHandler | None = None,
        on_created: CreatedHandler | None = None,
        min_poll: float = 0.05,
        max_poll: float = 30.0,
    ) -> None:
        self._on_input = on_input
        self._on_created = on_created
        self._min_poll = min_poll
        self._max_poll = max_poll

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=CreatedTask, resolve=self._resolve),)

    async def _resolve(self, created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        """Poll the task to its end; its ``CallToolResult``, or the error saying why not."""
        task_id = created.task_id
        await run_on_created(self._on_created, task_id)
        timeout = ctx.read_timeout_seconds
        answered: set[str] = set()
        task: Mapping[str, Any] = created.model_dump(by_alias=True, mode="json")
        while True:
            status = task.get("status")
            if status == "completed":
                return tool_result(task.get("result") or {}, task_id)
            if status == "failed":
                raise TaskFailedError(task)
            if status == "cancelled":
                raise TaskCancelledError(task)
            if status == "input_required":
                fresh = {
                    key: request
                    for key, request in (task.get("inputRequests") or {}).items()
                    if key not in answered
                }
                if fresh and self._on_input is None:
                    raise TaskError(f"task {task_id} needs input and no on_input was given")
                if fresh and self._on_input is not None:
                    answers = {
                        key: dict(await self._on_input(key, request))
                        for key, request in fresh.items()
                    }
                    update = _UpdateTask(
                        params=_UpdateParams(task_id=task_id, input_responses=answers)
                    )
                    await ctx.session.send_request(update, _Detailed, timeout)
                    answered.update(answers)
            await anyio.sleep(self._interval(task))
            get = _GetTask(params=_TaskParams(task_id=task_id))
            task = (await ctx.session.send_request(get, _Detailed, timeout)).model_extra or {}

    def _interval(self, task: Mapping[str, Any]) -> float:
        suggested = task.get("pollIntervalMs")
        seconds = suggested / 1000 if isinstance(suggested, int | float) else 1.0
        if not math.isfinite(seconds):
            seconds = 1.0
        return min(max(seconds, self._min_poll), self._max_poll)

    @staticmethod
    def stream_events(
        client: Any,
        task_id: str,
        *,
        after: int | None = None,
        on_gone: OnGone = "raise",
        idle_timeout: float = 30.0,
    ) -> TaskEventStream:
        """The task's events (``tasks/stream``) on the server ``client`` talks to, each once.

        ``client``: a FastMCP ``Client`` over HTTP (or the server's URL). The
        client's session hands notifications to extensions through a queue
        that drops the oldest and may reorder them, so the stream goes on a
        connection of its own, with the client's URL, headers and token, and
        resumes on its own (see :class:`~replaystore.mcp.client.TaskEventStream`).
        """
        return _stream_of(client, task_id, after=after, on_gone=on_gone, idle_timeout=idle_timeout)


def _stream_of(
    client: Any,
    task_id: str,
    *,
    after: int | None = None,
    on_gone: OnGone = "raise",
    idle_timeout: float = 30.0,
) -> TaskEventStream:
    """The events of ``task_id`` on the server a FastMCP ``Client`` (or a URL) talks to.

    The stream uses a connection of its own, with the client's URL, headers
    and authentication (an ``httpx2.Auth``, or a bearer token given as a
    string); it is closed with the stream.
    """
    transport = getattr(client, "transport", client)
    url = transport if isinstance(transport, str) else getattr(transport, "url", None)
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise TaskError(f"task events are read over HTTP; {client!r} has no HTTP URL")
    headers = dict(getattr(transport, "headers", None) or {})
    auth = getattr(transport, "auth", None)
    if auth == "oauth":
        raise TaskError("a client with OAuth cannot lend its token; give TaskClient an httpx2.Auth")
    if isinstance(auth, str):
        headers["Authorization"] = f"Bearer {auth}"
        auth = None
    tasks = TaskClient(url, http=httpx2.AsyncClient(auth=auth, timeout=30.0), headers=headers)
    return TaskEventStream(
        tasks, task_id, after=after, on_gone=on_gone, idle_timeout=idle_timeout, close_client=True
    )

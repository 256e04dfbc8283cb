"""Calling a tool as a durable task from a 2026-07-28 client, and picking it up after a restart.

A server speaking the tasks extension may answer ``tools/call`` with a task
instead of a result. :class:`TaskClient` declares the extension, polls
``tasks/get`` at the server's suggested ``pollIntervalMs``, answers the task's
``inputRequests`` through a callback (each key once), and returns the tool's
``CallToolResult`` (the SDK's ``mcp_types.CallToolResult``, as its own
client returns; or raises :class:`TaskFailedError` /
:class:`TaskCancelledError`). Give it ``on_created`` (a plain or an async
function) to persist the task id: after the client restarts,
:meth:`TaskClient.wait` with that id resumes the polling where it was, on
any replica behind any balancer::

    async with TaskClient("http://localhost:8000/mcp") as client:
        result = await client.call("report", {"days": 7}, on_input=ask_user, on_created=save)
    ...
    async with TaskClient("http://localhost:8000/mcp") as client:
        result = await client.wait(load(), on_input=ask_user)

Plain JSON-RPC over HTTP (``httpx2``, which the SDK uses): the SDK's own
client does not know the tasks extension's result shape.

Every request rides transient failures: a ``502``, ``503`` or ``504`` (a
replica whose store stalls, a balancer with no replica to try), a refused
or broken connection, a balancer's own error page (HTML, or a JSON-RPC error
with no id) and a -32603 saying the store did not serve it are sent again,
with the same JSON-RPC id, after a pause doubling from ``backoff`` up to
``max_backoff`` (longer when the answer's ``Retry-After`` asks), for at most
``retry_for`` seconds per request; then :class:`TaskUnavailableError`. Each
request id is a fresh random string, so a server of this package gives a
``tools/call`` sent again the task the first copy created, never a second.
Only a task's end (:class:`TaskFailedError`, :class:`TaskCancelledError`) or
a protocol error (:class:`TaskRequestError`: the server refused the request
itself) ends a call sooner.
"""

from __future__ import annotations

import inspect
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import httpx2
from mcp_types import CallToolResult
from pydantic import ValidationError

from .answers import (
    RETRY_STATUSES,
    TaskError,
    TaskRequestError,
    TaskUnavailableError,
    response_message,
    retry_after,
    transient,
)
from .closing import Closing
from .task_events import OnGone, TaskEventStream

__all__ = [
    "OnCreatedError",
    "TaskCancelledError",
    "TaskClient",
    "TaskError",
    "TaskFailedError",
    "TaskRequestError",
    "TaskUnavailableError",
]

EXTENSION = "io.modelcontextprotocol/tasks"
VERSION = "2026-07-28"

#: ``on_input(key, request)``: the response to one input request (an
#: ``elicitation/create`` request's answer is ``{"action": ..., "content": ...}``).
InputHandler = Callable[[str, dict[str, Any]], Awaitable[Mapping[str, Any]]]
#: ``on_created(task_id)``: a plain function or a coroutine function.
CreatedHandler = Callable[[str], Awaitable[None] | None]


class OnCreatedError(TaskError):
    """``on_created`` raised: the task exists and runs on; ``task_id`` says which.

    Raised from the callback's own exception (its ``__cause__``), so that a
    failure to persist the id never loses it: :meth:`TaskClient.wait` or
    :meth:`TaskClient.cancel` with ``task_id`` take the task from there.
    """

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"on_created failed for task {task_id} (the task runs on)")


async def run_on_created(on_created: CreatedHandler | None, task_id: str) -> None:
    """Call ``on_created(task_id)``, plain or async; its failure as :class:`OnCreatedError`."""
    if on_created is None:
        return
    try:
        outcome = on_created(task_id)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception as exc:
        raise OnCreatedError(task_id) from exc


def tool_result(result: Mapping[str, Any], tool: str) -> CallToolResult:
    """A ``tools/call`` (or a completed task's) result as the SDK's ``CallToolResult``."""
    try:
        return CallToolResult.model_validate(result, by_name=False)
    except ValidationError as exc:
        kind = result.get("resultType", "complete")
        raise TaskError(f"{tool}: the server's result ({kind}) is not a CallToolResult") from exc


class TaskFailedError(TaskError):
    """The task ended ``failed``; ``error`` is its JSON-RPC error."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = dict(task)
        self.error: dict[str, Any] = dict(task.get("error") or {})
        super().__init__(f"task {task.get('taskId')} failed: {self.error.get('message')}")


class TaskCancelledError(TaskError):
    """The task ended ``cancelled``."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = dict(task)
        super().__init__(f"task {task.get('taskId')} was cancelled")


class TaskClient(Closing):
    """A 2026-07-28 client for tools that run as tasks (see the module docstring).

    ``http``: an ``httpx2.AsyncClient`` to use (not closed here); ``headers``
    go with every request (authorization); polling waits at least
    ``min_poll`` and at most ``max_poll`` seconds whatever the server suggests.
    A request that fails transiently is sent again after ``backoff``
    seconds, doubling up to ``max_backoff``, for at most ``retry_for``
    seconds (see the module docstring).
    """

    def __init__(
        self,
        url: str,
        *,
        http: httpx2.AsyncClient | None = None,
        headers: Mapping[str, str] | None = None,
        min_poll: float = 0.05,
        max_poll: float = 30.0,
        retry_for: float = 60.0,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
    ) -> None:
        if not 0 < backoff <= max_backoff or retry_for < 0:
            raise ValueError("0 < backoff <= max_backoff and retry_for >= 0")
        self.url = url
        self._own = http is None
        self._http = http if http is not None else httpx2.AsyncClient(timeout=30.0)
        self._headers = dict(headers or {})
        self._min_poll = min_poll
        self._max_poll = max_poll
        self.retry_for = retry_for
        self.backoff = backoff
        self.max_backoff = max_backoff

    @property
    def http(self) -> httpx2.AsyncClient:
        """The HTTP client the requests go through."""
        return self._http

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def request(self, method: str, params: Mapping[str, Any], name: str) -> dict[str, Any]:
        """One JSON-RPC request, sent again while it fails transiently; its ``result``.

        Raises :class:`TaskRequestError` for an error the server means (a
        protocol error), :class:`TaskUnavailableError` once transient failures
        lasted ``retry_for`` seconds.
        """
        request_id = uuid.uuid4().hex  # one id for every copy: the server knows a copy
        body, headers = self.envelope(request_id, method, params, name)
        deadline = anyio.current_time() + self.retry_for
        pause = self.backoff
        while True:
            wait: float | None = None
            try:
                response = await self._http.post(self.url, json=body, headers=headers)
            except httpx2.TransportError as exc:  # refused, reset, timed out: not answered
                failure: dict[str, Any] = {"code": None, "message": f"{type(exc).__name__}: {exc}"}
            else:
                status = response.status_code
                message = response_message(
                    response.text, response.headers.get("content-type", ""), request_id
                )
                if message is not None and "error" not in message:
                    result: dict[str, Any] = message.get("result") or {}
                    return result
                if message is not None:
                    failure = dict(message["error"])
                    if not transient(failure, status):
                        raise TaskRequestError(method, failure)
                else:
                    failure = {"code": status, "message": f"HTTP {status}: no JSON-RPC response"}
                    if status not in RETRY_STATUSES:
                        raise TaskRequestError(method, failure)
                wait = retry_after(response.headers.get("retry-after"))
            delay = min(max(pause, wait or 0.0), self.max_backoff)
            if anyio.current_time() + delay > deadline:
                raise TaskUnavailableError(method, failure)
            await anyio.sleep(delay)
            pause = min(pause * 2, self.max_backoff)

    def envelope(
        self, request_id: str, method: str, params: Mapping[str, Any], name: str
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The JSON-RPC body and the HTTP headers of one request (the extension declared)."""
        meta = {
            "io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
        }
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": method,
            "params": {**params, "_meta": meta},
        }
        headers = {
            **self._headers,
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": method,
            "Mcp-Name": name,
        }
        return body, headers

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        on_input: InputHandler | None = None,
        on_created: CreatedHandler | None = None,
    ) -> CallToolResult:
        """Call ``tool``; if the server makes it a task, wait for the task's result.

        ``on_created(task_id)`` (plain or async) runs before polling starts:
        persist the id there to :meth:`wait` for it after a restart. If it
        raises, the call raises :class:`OnCreatedError` carrying the id.
        """
        params = {"name": tool, "arguments": dict(arguments or {})}
        result = await self.request("tools/call", params, tool)
        if result.get("resultType") != "task":
            return tool_result(result, tool)
        task_id = str(result["taskId"])
        await run_on_created(on_created, task_id)
        return await self.wait(task_id, on_input=on_input, first=result)

    async def get(self, task_id: str) -> dict[str, Any]:
        """The task as ``tasks/get`` returns it (the ``DetailedTask``)."""
        return await self.request("tasks/get", {"taskId": task_id}, task_id)

    async def cancel(self, task_id: str) -> None:
        """Ask the server to cancel the task (it may still end otherwise)."""
        await self.request("tasks/cancel", {"taskId": task_id}, task_id)

    async def wait(
        self,
        task_id: str,
        *,
        on_input: InputHandler | None = None,
        first: Mapping[str, Any] | None = None,
    ) -> CallToolResult:
        """Poll until the task ends: its ``CallToolResult``, or an exception saying why not.

        Each input request key is answered once (the server keeps showing a
        request until its answer is processed). Without ``on_input`` a task
        that needs input raises :class:`TaskError`.
        """
        answered: set[str] = set()
        task: Mapping[str, Any] = first if first is not None else await self.get(task_id)
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
                if fresh and on_input is None:
                    raise TaskError(f"task {task_id} needs input and no on_input was given")
                if fresh and on_input is not None:
                    answers = {key: dict(await on_input(key, req)) for key, req in fresh.items()}
                    await self.request(
                        "tasks/update", {"taskId": task_id, "inputResponses": answers}, task_id
                    )
                    answered.update(answers)
            await anyio.sleep(self._interval(task))
            task = await self.get(task_id)

    def _interval(self, task: Mapping[str, Any]) -> float:
        suggested = task.get("pollIntervalMs")
        seconds = suggested / 1000 if isinstance(suggested, int | float) else 1.0
        if not math.isfinite(seconds):
            seconds = 1.0
        return min(max(seconds, self._min_poll), self._max_poll)

    def stream_events(
        self,
        task_id: str,
        *,
        after: int | None = None,
        on_gone: OnGone = "raise",
        idle_timeout: float = 30.0,
    ) -> TaskEventStream:
        """The task's events after ``after`` (``tasks/stream``), each once, in order, to its end.

        See :class:`~replaystore.mcp.client.TaskEventStream`: it reconnects
        with the last ``seq`` it handed over until the server says the task
        ended and every event was sent.
        """
        return TaskEventStream(
            self, task_id, after=after, on_gone=on_gone, idle_timeout=idle_timeout
        )

"""Durable tasks for the official SDK (the ``io.modelcontextprotocol/tasks`` extension).

On the 2026-07-28 revision a dropped response stream cancels its request, and
durable work goes through tasks: ``tools/call`` answers a ``CreateTaskResult``
at once, the client polls ``tasks/get``, answers input requests with
``tasks/update`` and may ``tasks/cancel``, on any replica. :class:`ReplayTasks`
serves all of it through the SDK's public extension seam, with the task
records in the replay buffer's store (:mod:`replaystore.taskstore`)::

    tasks = ReplayTasks({"report": "optional"})
    mcp = MCPServer("demo", extensions=[tasks])
    app = streamable_http_app(mcp, buffer, tasks=tasks)

How each rule holds on every replica:

- the record is written before the ``CreateTaskResult`` is returned, so a
  ``tasks/get`` anywhere resolves at once;
- the tool runs on the replica that created the task, which holds a lease on
  it and renews it every ``check_interval`` (the leases of all the tasks a
  replica runs in one round trip); the same store call hands it the answers
  recorded by ``tasks/update`` (on any replica) and tells it when the task was
  cancelled, so cancellation and input reach the tool wherever it runs within
  one check interval;
- a replica that dies stops renewing: once the lease lapses, the task ends
  ``failed`` with a JSON-RPC error saying the server running it stopped, or,
  for a tool marked idempotent, is claimed by a survivor (one claimant wins,
  in the store) and run again; whichever replica looks first applies that,
  a reader (``tasks/get``, a listen stream) or the background scan every
  replica runs (:meth:`ReplayTasks.reaping`), so it happens whether or not
  anyone reads the task; a replica that shuts down fails its running tasks
  itself;
- ``ctx.elicit`` (and sampling, any server-to-client request) inside a task
  tool becomes an entry of ``inputRequests`` with a key the store issues, and
  waits for its answer; progress and log notifications are dropped, as the
  extension does not carry them;
- a terminal status is final in the store itself (one atomic step), so a late
  result after a cancel, or a second finisher, changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    CallToolRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ... import ReplayBuffer
from ...backends.coordination import Coordination, coordination_of
from ...errors import StorageError
from ...taskstore import (
    EventRetention,
    NotReplicatedError,
    TaskInputError,
    TaskRecord,
    TaskStore,
    valid_task_id,
)
from ...taskstore.sep2694 import STREAM_CAPABILITY, STREAM_METHOD
from ..refusals import bounded
from ..unavailable import store_unavailable
from .leases import Run
from .params import StreamParams, TaskIdParams, UpdateParams
from .runner import TaskRunner
from .session import TaskSession, default_owner, run_context, sdk_rerun, sdk_tool_names
from .stream import DEFAULT_CLIENT_STREAMS, DEFAULT_STREAMS, StreamSlots, stream_events
from .support import Mode, TaskSupport

__all__ = ["EXTENSION", "ReplayTasks", "TaskSession", "TaskSupport"]

logger = logging.getLogger("replaystore.mcp.tasks")

#: The extension's identifier, as clients declare it.
EXTENSION = "io.modelcontextprotocol/tasks"

#: How many input responses one ``tasks/update`` may carry, and the longest key.
MAX_RESPONSES = 64
MAX_KEY = 64

_NOT_FOUND = "Failed to retrieve task: Task not found"

#: The methods of the extension that name a task (``Mcp-Name: <taskId>``).
_NAMED = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})


class ReplayTasks(TaskRunner, Extension):
    """The tasks extension, its records in the store of the app's replay buffer.

    ``tools`` maps tool names to their :class:`TaskSupport` (or just the mode);
    unlisted tools never run as tasks. ``ttl`` (seconds) is how long a task is
    kept after its creation, ``poll_interval`` the suggested ``pollIntervalMs``
    (seconds), ``lease`` how long a runner may go silent before its tasks
    fail, ``check_interval`` how often a runner renews its lease and picks up
    cancellations and input responses. ``owner(ctx)`` names the principal a
    task belongs to (default: the authenticated principal, if any, as the SDK
    binds sessions: client, issuer, subject); a task is visible to its owner
    only.

    ``namespace``: whose tasks these are. Replicas of one app share their
    tasks; apps sharing one store must not, or one would answer, claim or
    fail the other's tasks. By default the server's name (given to
    :meth:`bind`); set it when two deployments of one server share a store
    and prefix (``namespace="billing-staging"``), or to let servers of
    different names serve one app's tasks.

    ``events``: how long each task's events are kept for ``tasks/stream``.
    ``max_client_streams``: how many ``tasks/stream`` requests one client
    (principal) may hold open for one task on this replica; ``max_streams``:
    how many this replica serves at once
    (:class:`~replaystore.mcp.tasks.stream.StreamSlots`).

    The tasks this replica runs are the :class:`~replaystore.mcp.tasks.runner.TaskRunner`'s
    (its base); this class adds what a request sees: the ``tools/call``
    interception and the ``tasks/*`` methods.
    """

    identifier = EXTENSION

    def __init__(
        self,
        tools: Mapping[str, TaskSupport | Mode],
        *,
        ttl: float = 3600.0,
        poll_interval: float = 1.0,
        lease: float = 5.0,
        check_interval: float = 0.25,
        owner: Callable[[ServerRequestContext[Any, Any]], str | None] | None = None,
        store: TaskStore | None = None,
        namespace: str | None = None,
        events: EventRetention | None = None,
        max_client_streams: int = DEFAULT_CLIENT_STREAMS,
        max_streams: int = DEFAULT_STREAMS,
    ) -> None:
        super().__init__(
            tools,
            ttl=ttl,
            poll_interval=poll_interval,
            lease=lease,
            check_interval=check_interval,
            store=store,
            namespace=namespace,
            events=events,
        )
        self._owner = owner
        #: The open ``tasks/stream`` requests of this replica, and their bounds.
        self.streams = StreamSlots(max_client_streams, max_streams)
        self.json_responses = False  # the app answers JSON only: no tasks/stream (the wiring)

    # -- wiring ------------------------------------------------------------------

    def bind(self, buffer: ReplayBuffer, server: Any = None) -> None:
        """Keep tasks in the store of ``buffer`` (its backend's replica coordination).

        ``server``: the ``MCPServer`` (or FastMCP server) whose tools these
        are, so that an idempotent tool's task can be run again here when its
        runner died, and :meth:`running` can check that every task tool
        exists. Its name is the tasks' namespace unless one was given.
        """
        self.serve(server)
        if self._store is None:
            self.keep_in(coordination_of(buffer.backend), buffer.backend)

    def serve(self, server: Any) -> None:
        """The tasks are ``server``'s (see :meth:`bind`): run again through it, named after it."""
        if isinstance(server, MCPServer):
            if self._rerun is None:
                self.rerun_with(sdk_rerun(self, server))
            if self._tool_names is None:
                self.served_by(sdk_tool_names(server))
        if self._namespace is None:
            name = getattr(server, "name", None)
            self._namespace = name if isinstance(name, str) else ""

    def keep_in(self, coordination: Coordination, backend: object) -> None:
        """Keep tasks in the task store of ``coordination`` (``backend``'s), unless given one.

        A status change counts once as many of the store's replicas as
        ``backend`` waits for acknowledged it (``wait_replicas``).
        """
        if self._store is None:
            self._store = coordination.task_store(
                namespace=self.namespace,
                wait_replicas=getattr(backend, "wait_replicas", 0),
                wait_timeout=getattr(backend, "wait_timeout", 1.0),
            )

    def settings(self) -> dict[str, Any]:
        """What ``server/discover`` advertises under the extension: task event streams."""
        return {} if self.json_responses else {STREAM_CAPABILITY: {}}

    def methods(self) -> list[MethodBinding]:
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskIdParams, self._get, versions),
            MethodBinding("tasks/update", UpdateParams, self._update, versions),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel, versions),
            MethodBinding(STREAM_METHOD, StreamParams, self._stream, versions),
        ]

    # -- tools/call ----------------------------------------------------------------

    def declared(self, ctx: ServerRequestContext[Any, Any]) -> bool:
        """Whether this request's client declared the extension (on 2026-07-28)."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return False
        capabilities = ctx.session.client_capabilities
        return bool(
            capabilities and capabilities.extensions and EXTENSION in capabilities.extensions
        )

    def owner_of(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        """The principal this request acts for (None: no owner)."""
        return self._owner(ctx) if self._owner is not None else default_owner()

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        support = self.task_support(params.name, ctx)
        if support is None:
            return await call_next(ctx)

        async def body(run: Run) -> HandlerResult:
            session = TaskSession(ctx.session, self, run)
            return await call_next(replace(ctx, session=session, close_sse_stream=None))

        return await self.start(support, ctx, body, params)

    async def start(
        self,
        support: TaskSupport,
        ctx: Any,
        body: Callable[[Run], Awaitable[HandlerResult]],
        params: CallToolRequestParams,
    ) -> dict[str, Any]:
        """Store a new task for this call, run ``body`` for it, return the ``CreateTaskResult``.

        The task belongs to the principal ``ctx`` acts for; a request sent
        again with the same id gets the same task (see :meth:`create`).
        """
        owner = self.owner_of(ctx)
        return await self.create(support, owner, getattr(ctx, "request_id", None), body, params)

    def task_support(self, tool: str, ctx: Any) -> TaskSupport | None:
        """How this call of ``tool`` runs: its :class:`TaskSupport` as a task, None as a plain call.

        A tool that requires a task, called by a client that did not declare
        the extension, raises -32021. ``ctx`` is the request context (the SDK's,
        or FastMCP's, which has the same ``session`` and ``protocol_version``).
        """
        support = self._tools.get(tool)
        if support is None or support.mode == "forbidden":
            return None
        if not self.declared(ctx):
            if support.mode == "required":
                require_client_extension(ctx, EXTENSION)  # raises -32021 with the details
                raise MCPError(INTERNAL_ERROR, "unreachable")  # pragma: no cover
            return None
        return support

    def run_context(
        self,
        run: Run,
        ctx: ServerRequestContext[Any, Any] | None,
        name: str,
        arguments: dict[str, Any],
    ) -> ServerRequestContext[Any, Any]:
        """The SDK request context a run of a task's tool (``name``, ``arguments``) sees."""
        return run_context(self, run, ctx, name, arguments)

    async def _stream(self, ctx: ServerRequestContext[Any, Any], params: StreamParams) -> Any:
        owner = self._check(ctx, params)
        if self.json_responses:
            # The events would be dropped and the empty result read as complete.
            raise MCPError(
                METHOD_NOT_FOUND, "tasks/stream needs SSE responses; this server answers JSON"
            )
        with self.streams.taken(params.task_id, owner):
            return await stream_events(self, ctx, params, owner)

    # -- tasks/* -------------------------------------------------------------------

    async def name_header(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        """Middleware: refuse a ``tasks/*`` request whose ``Mcp-Name`` names another task.

        The extension has clients mirror ``params.taskId`` into ``Mcp-Name``
        so that a balancer may route on it; a server that reads the body must
        refuse a request whose header and body disagree (-32020, HTTP 400),
        as the SDK does for ``tools/call``. A request without the header is
        served (clients of earlier drafts do not send it). The app wiring
        adds it to the server's middleware.
        """
        # The HTTP request the message came in (None on other transports).
        headers = getattr(ctx.request, "headers", None) if ctx.method in _NAMED else None
        header = headers.get(MCP_NAME_HEADER) if headers is not None else None
        if header is not None:
            task_id = (ctx.params or {}).get("taskId")
            if isinstance(task_id, str) and decode_header_value(header) != task_id:
                raise MCPError(HEADER_MISMATCH, f"{MCP_NAME_HEADER} header does not match taskId")
        return await call_next(ctx)

    def _check(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> str | None:
        if not self.declared(ctx):
            require_client_extension(ctx, EXTENSION)
        if not valid_task_id(params.task_id):
            raise MCPError(INVALID_PARAMS, _NOT_FOUND)
        return self.owner_of(ctx)

    async def _get(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> HandlerResult:
        owner = self._check(ctx, params)
        record = await self._stored(self.store.get(params.task_id, owner=owner))
        if isinstance(record, TaskRecord) and record.rerun:
            await self.take_over(params.task_id, ctx)
            record = await self._stored(self.store.get(params.task_id, owner=owner))
        if not isinstance(record, TaskRecord):
            raise MCPError(INVALID_PARAMS, _NOT_FOUND)
        return {"resultType": "complete", **record.detailed()}

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateParams
    ) -> HandlerResult:
        owner = self._check(ctx, params)
        answers = params.input_responses
        if len(answers) > MAX_RESPONSES or any(len(key) > MAX_KEY for key in answers):
            raise MCPError(
                INVALID_PARAMS,
                f"inputResponses holds at most {MAX_RESPONSES} keys "
                f"of at most {MAX_KEY} characters",
            )
        try:
            known = await self._stored(self.store.respond(params.task_id, answers, owner=owner))
        except TaskInputError as exc:
            raise MCPError(INVALID_PARAMS, f"inputResponses cannot be stored: {exc}") from None
        if not known:
            raise MCPError(INVALID_PARAMS, _NOT_FOUND)
        return {}

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> HandlerResult:
        owner = self._check(ctx, params)
        known = await self._stored(
            self.store.cancel(params.task_id, owner=owner, message="cancelled by the client")
        )
        if not known:
            raise MCPError(INVALID_PARAMS, _NOT_FOUND)
        self.stop(params.task_id)  # running here: stop it now rather than at the next beat
        return {}

    async def _stored(self, call: Any) -> Any:
        """Await a client's store call for at most ``store_timeout``; a store error is a 503.

        A change (``tasks/update``, ``tasks/cancel``) answered so may still
        have been made: the store may have run it before its reply was lost
        or late. Both are safe to repeat.
        """
        try:
            with bounded(self.store_timeout):
                return await call
        except NotReplicatedError as exc:
            logger.warning("task change not replicated: %s", exc)
            raise store_unavailable(StorageError(str(exc), kind="unreplicated")) from None
        except StorageError as exc:
            logger.warning("task store did not serve a request (answered 503): %s", exc)
            raise store_unavailable(exc) from None

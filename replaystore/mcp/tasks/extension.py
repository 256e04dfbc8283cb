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
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import anyio
import anyio.abc
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolRequestParams,
)
from mcp_types.version import LATEST_MODERN_VERSION, MODERN_PROTOCOL_VERSIONS

from ... import ReplayBuffer
from ...backends.coordination import coordination_of
from ...errors import StorageError
from ...taskstore import (
    FAILED,
    LOST_ERROR,
    EventRetention,
    NotReplicatedError,
    TaskInputError,
    TaskRecord,
    TaskStore,
    new_task_id,
    valid_task_id,
)
from ...taskstore.sep2694 import STREAM_CAPABILITY, STREAM_METHOD
from ..metrics import count_task_end
from ..refusals import bounded
from ..settings import DEFAULT_STORE_TIMEOUT
from ..unavailable import store_unavailable
from .creation import UNANSWERED_ERROR, Creations, Job, request_task_id
from .drain import SHUTDOWN_ERROR, drain_runs, draining, hand_over
from .leases import Nudged, Run, renew, scan
from .params import StreamParams, TaskIdParams, UpdateParams
from .session import (
    Rerun,
    TaskSession,
    default_owner,
    result_of,
    sdk_rerun,
    sdk_tool_names,
)
from .stream import stream_events
from .support import Mode, TaskSupport

__all__ = ["EXTENSION", "ReplayTasks", "TaskSession", "TaskSupport"]

logger = logging.getLogger("replaystore.mcp.tasks")

#: The extension's identifier, as clients declare it.
EXTENSION = "io.modelcontextprotocol/tasks"

#: How many input responses one ``tasks/update`` may carry, and the longest key.
MAX_RESPONSES = 64
MAX_KEY = 64

#: Leases a re-runnable task waits, lapsed, for a replica that serves its tool
#: to claim it; then any replica claims it, to fail it as lost.
UNSERVED_LEASES = 2

_NOT_FOUND = "Failed to retrieve task: Task not found"


class ReplayTasks(Extension):
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
    ) -> None:
        self._tools = {
            name: support if isinstance(support, TaskSupport) else TaskSupport(support)
            for name, support in tools.items()
        }
        if not 0 < ttl <= 366 * 86400:
            raise ValueError("ttl is between 0 and 366 days (seconds)")
        if not 0 < check_interval < lease <= 3600:
            raise ValueError("0 < check_interval < lease <= 3600 seconds")
        if not 0 < poll_interval <= 3600:
            raise ValueError("0 < poll_interval <= 3600 seconds")
        self.ttl = ttl
        self.poll_interval = poll_interval
        self.lease = lease
        self.check_interval = check_interval
        self.events = events if events is not None else EventRetention()
        self._owner = owner
        self._store = store
        self._namespace = namespace
        self._tool_names: Callable[[], Awaitable[Collection[str]]] | None = None
        self._runner = new_task_id()  # this replica, as a lease holder
        self._group: anyio.abc.TaskGroup | None = None
        self._runs: dict[str, Run] = {}
        #: Seconds running tasks may go on once :meth:`drain` was called (set by the wiring).
        self.drain_seconds = 0.0
        #: When the drain ends (``time.monotonic()``), once :meth:`drain` was called.
        self._drain_until: float | None = None
        self._rerun: Rerun | None = None
        self._lifespan: Callable[[], Any] | None = None
        self.json_responses = False  # the app answers JSON only: no tasks/stream (the wiring)
        #: How long a client's request waits for the store before it is answered
        #: 503 (the app's ``store_timeout``, set by the app wiring).
        self.store_timeout = DEFAULT_STORE_TIMEOUT
        self._creations = Creations(lambda: self.store, self._runner, lease)

    # -- wiring ------------------------------------------------------------------

    def bind(self, buffer: ReplayBuffer, server: Any = None) -> None:
        """Keep tasks in the store of ``buffer`` (its backend's replica coordination).

        ``server``: the ``MCPServer`` (or FastMCP server) whose tools these
        are, so that an idempotent tool's task can be run again here when its
        runner died, and :meth:`running` can check that every task tool
        exists. Its name is the tasks' namespace unless one was given.
        """
        if isinstance(server, MCPServer):
            if self._rerun is None:
                self.rerun_with(sdk_rerun(self, server))
            if self._tool_names is None:
                self.served_by(sdk_tool_names(server))
        if self._namespace is None:
            name = getattr(server, "name", None)
            self._namespace = name if isinstance(name, str) else ""
        if self._store is None:
            backend = buffer.backend
            self._store = coordination_of(backend).task_store(
                namespace=self._namespace,
                wait_replicas=getattr(backend, "wait_replicas", 0),
                wait_timeout=getattr(backend, "wait_timeout", 1.0),
            )

    def served_by(self, tool_names: Callable[[], Awaitable[Collection[str]]]) -> None:
        """How to list the tools the server defines (set by the server wiring).

        :meth:`running` refuses to start when a task tool is not among them:
        a call of it would otherwise create a task that can only fail.
        """
        self._tool_names = tool_names

    @property
    def namespace(self) -> str:
        """Whose tasks these are: replicas with the same namespace share their tasks."""
        return self._namespace or ""

    async def check_tools(self) -> None:
        """Raise ``ValueError`` naming each task tool the server does not define.

        Nothing to check before :meth:`served_by` (or :meth:`bind` with a
        server) said how to list the server's tools.
        """
        if self._tool_names is None:
            return
        defined = set(await self._tool_names())
        missing = sorted(name for name in self._tools if name not in defined)
        if missing:
            raise ValueError(
                f"ReplayTasks names tool(s) the server does not define: {', '.join(missing)} "
                f"(the server defines: {', '.join(sorted(defined)) or 'no tools'})"
            )

    def rerun_with(self, rerun: Rerun) -> None:
        """How this replica runs a task's stored call again (set by the server wiring)."""
        self._rerun = rerun

    @property
    def store(self) -> TaskStore:
        if self._store is None:
            raise RuntimeError(
                "ReplayTasks is not bound to a store: pass it to streamable_http_app"
            )
        return self._store

    @property
    def lifespan_state(self) -> Any:
        """The server's lifespan state, for a run that no request started (see :meth:`reaping`)."""
        return self._lifespan() if self._lifespan is not None else {}

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run task tools while this context is open; on exit, hand over those still running.

        One background job renews the leases of every task running here, in
        one store round trip per ``check_interval`` (none while no task runs),
        and beats a task at once when a client answers or cancels it on any
        replica (the store's nudges). Refuses to start (``ValueError``) when
        a task tool is not defined by the server (see :meth:`check_tools`).
        """
        await self.check_tools()
        nudged = Nudged()
        async with (
            self.store.nudges(self._runner, nudged),
            anyio.create_task_group() as group,
        ):
            self._group = group
            group.start_soon(
                renew, self.store, self._runs, self._runner, self.lease, self.check_interval, nudged
            )
            try:
                yield
            finally:
                self._group = None
                with anyio.CancelScope(shield=True):
                    if self._drain_until is not None:
                        left = self._drain_until - time.monotonic()
                        await drain_runs(self._runs, max(0.0, left))
                    await hand_over(self.store, self._runs, self._runner, self.store_timeout)
                group.cancel_scope.cancel()

    @property
    def draining(self) -> bool:
        """Whether :meth:`drain` was called: no new task is taken, open streams end early."""
        return self._drain_until is not None

    @property
    def runner(self) -> str:  # this replica, as the holder of the tasks it runs
        return self._runner

    def running_states(self) -> list[str]:  # ``input_required`` while it waits for an answer
        return ["input_required" if run.waiting else "working" for run in list(self._runs.values())]

    def drain(self) -> None:
        """Take no new task (503), for the process is stopping (on ``SIGTERM``).

        Running tasks go on for up to :attr:`drain_seconds` from this call
        (the server may stop serving requests sooner: :meth:`running` exits
        then, and waits for the rest of the drain), then are handed over
        (:mod:`~replaystore.mcp.tasks.drain`).
        """
        if self._drain_until is None:
            self._drain_until = time.monotonic() + self.drain_seconds

    @asynccontextmanager
    async def reaping(self, lifespan: Callable[[], Any] | None = None) -> AsyncIterator[None]:
        """Scan the store for tasks whose runner died while this context is open.

        Enter it inside :meth:`running`, once the server serves requests
        (``streamable_http_app`` and ``fastmcp_http_app`` do). Every replica
        scans: a task whose lease lapsed ends ``failed`` (or, for an
        idempotent tool, is claimed and run again here if this replica wins
        the claim) at most a moment after its lease lapses, even if no client
        ever reads it again. A scan wakes when the earliest lease it knows of
        may lapse, and at least once per ``lease``; with no task running
        anywhere that is one store call per ``lease``. ``lifespan`` returns
        the server's lifespan state, handed to a tool run again here with no
        request behind it.
        """
        if self._group is None:
            raise RuntimeError("enter ReplayTasks.reaping() inside ReplayTasks.running()")
        self._lifespan = lifespan
        async with anyio.create_task_group() as group:
            group.start_soon(scan, self.store, self.lease, self._take_over_orphan)
            try:
                yield
            finally:
                group.cancel_scope.cancel()

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

    async def start(
        self,
        support: TaskSupport,
        ctx: Any,
        body: Callable[[Run], Awaitable[HandlerResult]],
        params: CallToolRequestParams,
    ) -> dict[str, Any]:
        """Store a new task, run ``body`` for it in the background, return the ``CreateTaskResult``.

        The record is written before this returns, so the task resolves on any
        replica as soon as the client has its id. An idempotent tool's call
        (``params``) is stored with it, for a survivor to run again. A store
        that gives no answer within ``store_timeout`` is a 503; the request
        sent again gets the same task when its id names it
        (:mod:`~replaystore.mcp.tasks.creation`).
        """
        group = self._group
        if group is None:
            raise MCPError(INTERNAL_ERROR, "the task runner is not running")
        if self._drain_until is not None:
            raise draining()
        ttl = support.ttl if support.ttl is not None else self.ttl
        owner = self.owner_of(ctx)
        arguments = params.arguments or {}
        request_id = getattr(ctx, "request_id", None)
        keyed = request_task_id(self.namespace, owner, request_id, params.name, arguments)
        task_id = keyed or new_task_id()
        call = {"name": params.name, "arguments": arguments} if support.idempotent else None

        def launch() -> None:
            run = self._runs[task_id] = Run(task_id, rerunnable=call is not None)
            group.start_soon(self._run, run, body)

        async def refuse() -> None:
            await self._finish(task_id, FAILED, dict(UNANSWERED_ERROR), None)

        job = Job(
            task_id,
            keyed is not None,
            owner,
            lambda: self.store.create(
                task_id,
                runner=self._runner,
                lease=self.lease,
                ttl_ms=math.ceil(ttl * 1000),
                poll_ms=math.ceil(self.poll_interval * 1000),
                owner=owner,
                attempts=support.attempts if call is not None else 1,
                call=call,
                events=self.events,
            ),
            lambda: task_id in self._runs,
            launch,
            refuse,
        )
        try:
            record = await self._creations.create(job, group, self.store_timeout)
        except TaskInputError as exc:
            raise MCPError(INVALID_PARAMS, f"the arguments cannot be kept: {exc}") from None
        except StorageError as exc:
            logger.warning("task store did not serve a tools/call (answered 503): %s", exc)
            raise store_unavailable(exc) from None
        return {"resultType": "task", **record.detailed()}

    def run_context(
        self,
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
                session=TaskSession(None, self, run),
                lifespan_context=self.lifespan_state,
                protocol_version=LATEST_MODERN_VERSION,
                method="tools/call",
                params={"name": name, "arguments": arguments},
            )
        return replace(ctx, session=TaskSession(ctx.session, self, run), close_sse_stream=None)

    async def _take_over_orphan(self, task_id: str) -> bool:
        return await self.take_over(task_id, None)

    async def take_over(self, task_id: str, ctx: Any) -> bool:
        """Run again here a re-runnable task whose runner died, if this replica wins the claim.

        Called by whoever finds a task the store flags ``rerun``: a reader
        (``tasks/get``, listen streams), with that request's context, or the
        background scan, with None. The new run's input requests and
        cancellation work as for the first run. True if the run started here.
        A task of a tool this replica does not run again (not served here, or
        not idempotent here) is not claimed: a replica of the same namespace
        that serves it does. Only once its lease has been lapsed for
        :data:`UNSERVED_LEASES` leases (every replica scans once a lease, so
        none serving it is alive) does this replica claim it, to fail it as
        lost rather than leave it active until its TTL.
        """
        if self._group is None:
            return False
        served = [n for n, s in self._tools.items() if s.idempotent] if self._rerun else []
        grace = UNSERVED_LEASES * self.lease
        try:
            call = await self.store.claim(
                task_id, self._runner, self.lease, tools=served, grace=grace
            )
        except StorageError as exc:
            logger.warning("task %s: claim failed: %s", task_id, exc)
            return False
        if call is None:
            return False
        name, arguments = call.get("name"), call.get("arguments")
        support = self._tools.get(name) if isinstance(name, str) else None
        rerun = self._rerun
        if rerun is None or support is None or not support.idempotent:
            await self._finish(task_id, FAILED, dict(LOST_ERROR), str(LOST_ERROR["message"]))
            return False
        logger.info("task %s: its runner stopped; running %s again here", task_id, name)
        run = Run(task_id, rerunnable=True)
        self._runs[task_id] = run
        args = arguments if isinstance(arguments, dict) else {}
        self._group.start_soon(self._run, run, lambda r: rerun(str(name), args, r, ctx))
        return True

    async def _run(self, run: Run, body: Callable[[Run], Awaitable[HandlerResult]]) -> None:
        status, payload = FAILED, dict(SHUTDOWN_ERROR)
        message: str | None = None
        try:
            with run.scope:
                try:
                    status, payload = "completed", result_of(await body(run))
                except MCPError as exc:
                    status = FAILED
                    payload = exc.error.model_dump(by_alias=True, mode="json", exclude_none=True)
                    message = exc.error.message
                except Exception:
                    logger.exception("task tool %s raised", run.task_id)
                    status, payload = FAILED, {"code": INTERNAL_ERROR, "message": "tool failed"}
                    message = "the tool failed"
            run.done = True
            if run.ended or run.scope.cancelled_caught:
                return  # the store already holds the end (cancelled, lost or expired)
            if status == "completed" and payload.get("resultType") == "input_required":
                status = FAILED
                payload = {
                    "code": INTERNAL_ERROR,
                    "message": "the tool returned an input_required result, which a task "
                    "cannot carry (ask through ctx.elicit instead)",
                }
                message = str(payload["message"])
        finally:
            run.done = True
            self._runs.pop(run.task_id, None)
            if not run.ended and not run.scope.cancelled_caught:
                with anyio.CancelScope(shield=True):
                    await self._finish(run.task_id, status, payload, message)

    async def _finish(
        self, task_id: str, status: str, payload: dict[str, Any], message: str | None
    ) -> None:
        """Store a run's end, as the runner holding the task (fenced: a task taken over is not
        ended by its former run). A store that does not answer is tried again for up to
        two leases (a stall): the runner holding the task is alive, so the end still stands."""
        completed = status == "completed"
        give_up = anyio.current_time() + 2 * self.lease
        while True:
            try:
                try:
                    await self.store.finish(
                        task_id,
                        status,
                        result=payload if completed else None,
                        error=None if completed else payload,
                        message=message,
                        runner=self._runner,
                    )
                    count_task_end(status)
                except TaskInputError as exc:
                    text = f"the tool's result cannot be stored: {exc}"
                    error = {"code": INTERNAL_ERROR, "message": text}
                    await self.store.finish(
                        task_id, FAILED, error=error, message=text, runner=self._runner
                    )
                return
            except StorageError as exc:
                if anyio.current_time() >= give_up:
                    # The lease lapses and the task fails as lost: never silently working.
                    logger.warning("task %s: could not store its end: %s", task_id, exc)
                    return
            await anyio.sleep(self.check_interval)

    async def _stream(self, ctx: ServerRequestContext[Any, Any], params: StreamParams) -> Any:
        return await stream_events(self, ctx, params, self._check(ctx, params))

    async def _input(self, run: Run, request: dict[str, Any]) -> dict[str, Any]:
        """Ask the client through ``inputRequests``; wait for the answer, wherever it lands."""
        try:
            keys = await self.store.ask(run.task_id, self._runner, [request])
        except StorageError as exc:
            raise MCPError(INTERNAL_ERROR, "the task store is unreachable") from exc
        except TaskInputError as exc:
            raise MCPError(INVALID_PARAMS, f"the input request cannot be stored: {exc}") from exc
        if not keys:  # the task ended meanwhile: stop here
            run.ended = True
            run.scope.cancel()
            await anyio.sleep_forever()
        key = keys[0] if keys else ""
        if key not in run.answers:
            event = run.waiting[key] = anyio.Event()
            await event.wait()
        return run.answers.pop(key)

    # -- tasks/* -------------------------------------------------------------------

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
        run = self._runs.get(params.task_id)
        if run is not None:  # running here: stop it now rather than at the next beat
            run.ended = True
            run.scope.cancel()
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

"""The runner: the tasks this replica runs, from their creation to their stored end.

A task's tool runs on the replica that created it (or, for an idempotent
tool, on the survivor that claimed it once its runner died). :class:`TaskRunner`
is that side of :class:`~replaystore.mcp.tasks.ReplayTasks`: it stores a new
task and starts its tool, renews the leases of every task running here
(:mod:`~replaystore.mcp.tasks.leases`), asks the client for input through the
store, claims and runs again an orphaned task, stores each run's end, and
hands what still runs over when the replica stops
(:mod:`~replaystore.mcp.tasks.drain`). What a request sees of the tasks (the
``tools/call`` interception and the ``tasks/*`` methods) is the extension's
(:mod:`~replaystore.mcp.tasks.extension`); what the tool itself sees, its
session, is :mod:`~replaystore.mcp.tasks.session`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
from mcp.server.context import HandlerResult
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolRequestParams
from pydantic import BaseModel

from ...errors import StorageError
from ...taskstore import (
    FAILED,
    LOST_ERROR,
    EventRetention,
    TaskInputError,
    TaskStore,
    new_task_id,
)
from ..metrics import count_task_end
from ..settings import DEFAULT_STORE_TIMEOUT
from ..unavailable import store_unavailable
from .creation import UNANSWERED_ERROR, Creations, Job, request_task_id
from .drain import SHUTDOWN_ERROR, drain_runs, draining, hand_over
from .leases import Nudged, Run, renew, scan
from .support import Mode, TaskSupport

__all__ = ["UNSERVED_LEASES", "Rerun", "TaskRunner"]

logger = logging.getLogger("replaystore.mcp.tasks")

#: Leases a re-runnable task waits, lapsed, for a replica that serves its tool
#: to claim it; then any replica claims it, to fail it as lost.
UNSERVED_LEASES = 2

#: Runs a task's stored call again: ``(tool, arguments, run, ctx)`` → the tool's result.
#: ``ctx`` is the request context of the reader that found the task orphaned,
#: or None when the background scan did.
Rerun = Callable[[str, dict[str, Any], Run, Any], Awaitable[HandlerResult]]


class TaskRunner:
    """Runs the tasks of this replica (see the module docstring); the base of ``ReplayTasks``.

    The parameters are :class:`~replaystore.mcp.tasks.ReplayTasks`'s own,
    checked here.
    """

    def __init__(
        self,
        tools: Mapping[str, TaskSupport | Mode],
        *,
        ttl: float,
        poll_interval: float,
        lease: float,
        check_interval: float,
        store: TaskStore | None,
        namespace: str | None,
        events: EventRetention | None,
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
        self._store = store
        self._namespace = namespace
        self._runner = new_task_id()  # this replica, as a lease holder
        self._group: anyio.abc.TaskGroup | None = None
        self._runs: dict[str, Run] = {}
        #: Seconds running tasks may go on once :meth:`drain` was called (set by the wiring).
        self.drain_seconds = 0.0
        #: When the drain ends (``time.monotonic()``), once :meth:`drain` was called.
        self._drain_until: float | None = None
        self._rerun: Rerun | None = None
        self._lifespan: Callable[[], Any] | None = None
        self._tool_names: Callable[[], Awaitable[Collection[str]]] | None = None
        #: How long a client's request waits for the store before it is answered
        #: 503 (the app's ``store_timeout``, set by the app wiring).
        self.store_timeout = DEFAULT_STORE_TIMEOUT
        self._creations = Creations(lambda: self.store, self._runner, lease)

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

    async def create(
        self,
        support: TaskSupport,
        owner: str | None,
        request_id: object,
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
        arguments = params.arguments or {}
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
                    status, payload = "completed", _result_of(await body(run))
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

    async def ask(self, run: Run, request: dict[str, Any]) -> dict[str, Any]:
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

    def stop(self, task_id: str) -> None:
        """Stop the tool of ``task_id`` now if it runs here (its end is in the store already)."""
        run = self._runs.get(task_id)
        if run is not None:
            run.ended = True
            run.scope.cancel()


def _result_of(value: HandlerResult) -> dict[str, Any]:
    """A tool's result as the task stores it (JSON)."""
    if value is None:
        return {}
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dict(value)

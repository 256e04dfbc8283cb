"""Creating a task once per request, whatever the store does while it is created.

A ``tools/call`` that the store does not serve in time is answered ``503``
(:mod:`replaystore.mcp.unavailable`), and the client, or a balancer, sends it
again. The first create may still have reached the store (the store was only
slow, or its reply was lost): without care the retry makes a second task and
the first runs with nobody knowing its id.

So a request names its task: a ``tools/call`` whose JSON-RPC id is a string
of at least :data:`KEYED_ID` characters (a client-chosen unique id, e.g. a
UUID; ``TaskClient`` sends one) creates its task under an id derived from
the server's namespace, the task's owner, that request id, the tool and its
arguments (:func:`request_task_id`). The store creates an id only if absent,
in one atomic step, so every copy of the request, on any replica, resolves
to one task. Shorter ids (clients count from 1 and would collide) get a
random task id, as before.

The create itself is never abandoned midway: it runs in the background
(:class:`Creations`) and the request waits for it at most ``store_timeout``.
Until the store gives a definite answer the create is sent again (it is
idempotent by id); the replica whose create stored the task runs it, once,
however late the answer came.

A task with a random id (a numeric request id, as the SDK's client sends)
whose request was already answered with an error must never run: nobody can
learn its id, and the client's retry makes another task. Its outcome may be
unknown (the store stalled: the create may still be stored when it wakes),
so it is *refused*: this replica stores the task itself if absent and ends
it, in that order, with :data:`UNANSWERED_ERROR`, sending both again until
the store answers. A create still in flight then finds the id taken and
stores nothing; one stored first is ended before its lease can lapse (the
refusal is sent again at most a quarter lease, and 2 s, apart), so no other
replica claims it to run it again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from ...errors import StorageError
from ...taskstore import TERMINAL, NotReplicatedError, TaskInputError, TaskRecord, TaskStore

__all__ = ["KEYED_ID", "RESOLVE_FOR", "UNANSWERED_ERROR", "Creations", "request_task_id"]

logger = logging.getLogger(__name__)

#: Shortest string request id that names its task (shorter ones are not unique enough).
KEYED_ID = 16
#: How long a create whose outcome is unknown is sent again before it is left to the lease.
RESOLVE_FOR = 60.0
#: How long a replica remembers that it started a task, so no copy of its request starts it again.
REMEMBER = 600.0
#: The error of a task stored after its request was answered with an error.
UNANSWERED_ERROR: dict[str, Any] = {
    "code": -32603,
    "message": "the request that created this task was answered with an error; it was not run",
}


def request_task_id(
    namespace: str, owner: str | None, request_id: Any, name: str, arguments: Any
) -> str | None:
    """The task id a ``tools/call`` names, or None when its request id is not unique enough.

    A digest (144 bits, the shape of a random task id) of everything that
    makes the request this request: a retry of it has the same, another
    client's request (another owner, id, tool or arguments) another.
    """
    if not isinstance(request_id, str) or len(request_id) < KEYED_ID:
        return None
    text = json.dumps(
        [namespace, owner or "", request_id, name, arguments],
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    digest = hashlib.sha256(text.encode()).digest()[:18]
    return base64.urlsafe_b64encode(digest).decode()


@dataclass
class Job:
    """What creating one task takes (given by the tasks extension).

    ``new()`` stores the task (``ValueError`` when the id exists);
    ``running()`` whether this replica runs it already; ``launch()`` starts
    its run here; ``refuse()`` ends it with :data:`UNANSWERED_ERROR`.
    """

    task_id: str
    keyed: bool
    owner: str | None
    new: Callable[[], Awaitable[TaskRecord]]
    running: Callable[[], bool]
    launch: Callable[[], None]
    refuse: Callable[[], Awaitable[None]]


@dataclass
class _Creation:
    job: Job
    changed: anyio.Event = field(default_factory=anyio.Event)
    record: TaskRecord | None = None
    error: BaseException | None = None
    answered: bool = False  # a request was answered (with an error) before the outcome

    def settle(self, record: TaskRecord | None, error: BaseException | None) -> None:
        self.record, self.error = record, error
        changed, self.changed = self.changed, anyio.Event()
        changed.set()


class Creations:
    """The task creations in flight on one replica, one per task id."""

    def __init__(self, store: Callable[[], TaskStore], runner: str, lease: float) -> None:
        self._store = store
        self._runner = runner
        self._lease = lease
        self._pending: dict[str, _Creation] = {}
        self._started: dict[str, float] = {}  # task id -> until when it is remembered

    async def create(self, job: Job, group: anyio.abc.TaskGroup, patience: float) -> TaskRecord:
        """The task of ``job``, stored (by this request, or by an earlier copy of it).

        Raises :class:`StorageError` when the store gave no definite answer
        within ``patience`` seconds (the create goes on in the background), or
        the store's error (``TaskInputError`` for arguments that cannot be
        kept, ``NotReplicatedError`` for a task stored without enough replicas).
        """
        creation = self._pending.get(job.task_id)
        if creation is None:
            creation = self._pending[job.task_id] = _Creation(job)
            group.start_soon(self._settle, creation)
        changed = creation.changed
        with anyio.move_on_after(patience):
            await changed.wait()
        if not changed.is_set():
            creation.answered = True
            raise StorageError(f"the task store did not answer within {patience:g} s")
        if creation.record is None or creation.error is not None:
            creation.answered = True
            raise creation.error or StorageError("the task store did not answer")
        return creation.record

    async def _settle(self, creation: _Creation) -> None:
        job = creation.job
        try:
            outcome = await self._resolve(creation)
            if outcome is None:
                return
            record, mine, error = outcome
            if mine and not job.keyed and (creation.answered or error is not None):
                await job.refuse()  # its request is (or was) answered with an error
            elif mine:
                self._launch(job)
            if record is None and error is None:
                error = _gone(job)
            creation.settle(record, error)
        finally:
            if self._pending.get(job.task_id) is creation:
                del self._pending[job.task_id]

    async def _resolve(
        self, creation: _Creation
    ) -> tuple[TaskRecord | None, bool, BaseException | None] | None:
        """Create until the store answers for sure; None when given up (the answer is settled)."""
        job = creation.job
        store = self._store()
        deadline = anyio.current_time() + RESOLVE_FOR
        pause = 0.05
        while True:
            try:
                return await self._outcome(job, store)
            except TaskInputError as exc:
                creation.settle(None, exc)
                return None
            except StorageError as exc:
                creation.settle(None, exc)
                if not job.keyed and creation.answered:
                    await _refuse(job, deadline, min(2.0, self._lease / 4))
                    return None
                if anyio.current_time() > deadline:
                    # Left to the lease: if it was stored, it lapses like a lost run.
                    logger.warning("task %s: its creation stays unknown: %s", job.task_id, exc)
                    return None
                await anyio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def _outcome(
        self, job: Job, store: TaskStore
    ) -> tuple[TaskRecord | None, bool, BaseException | None]:
        """One create: the record, whether this replica is to run it, an error to answer."""
        try:
            return await job.new(), True, None
        except NotReplicatedError as exc:  # stored on the primary: it is ours
            return await store.get(job.task_id, owner=job.owner), True, exc
        except TaskInputError:
            raise
        except ValueError:  # the id exists: an earlier copy of this request stored it
            mine = await self._unrun(job, store)
            return await store.get(job.task_id, owner=job.owner), mine, None

    def _launch(self, job: Job) -> None:
        """Start the run; remember it (its end may not be stored yet when a copy comes)."""
        now = anyio.current_time()
        while self._started and next(iter(self._started.values())) < now:
            del self._started[next(iter(self._started))]
        self._started[job.task_id] = now + REMEMBER
        job.launch()

    async def _unrun(self, job: Job, store: TaskStore) -> bool:
        """Whether this replica stored the task (an earlier attempt) and nobody runs it yet.

        Its lease names this replica (renewed here, atomically, so it does not
        lapse meanwhile) and it has not ended; the runs of this process say
        whether it already runs here.
        """
        if job.running() or job.task_id in self._started:
            return False  # and no beat here: the renewals of its run take its answers
        beat = await store.beat(job.task_id, self._runner, self._lease)
        return beat is not None and beat.status not in TERMINAL and not job.running()


async def _refuse(job: Job, deadline: float, longest: float) -> None:
    """End the task of ``job``, stored or not yet, so that it never runs (module docstring).

    Stored here first if absent (a create still in flight then stores
    nothing), then ended by this replica, the runner both creates name; each
    step sent again until the store answers, up to ``deadline``, at most
    ``longest`` seconds apart (a quarter lease: a create stored late is
    ended before its lease lets another replica claim it).
    """
    pause = 0.05
    while True:
        try:
            try:
                await job.new()
            except TaskInputError:
                return  # its arguments cannot be stored: nothing was
            except (ValueError, NotReplicatedError):
                pass  # stored already (by the create whose answer was lost), or now
            await job.refuse()
            logger.info("task %s: its request was answered with an error; ended unrun", job.task_id)
            return
        except StorageError as exc:
            if anyio.current_time() > deadline:
                logger.warning(
                    "task %s: its request was answered with an error and the store still "
                    "does not answer; if stored, it lapses like a lost run: %s",
                    job.task_id,
                    exc,
                )
                return
            await anyio.sleep(pause)
            pause = min(pause * 2, longest)


def _gone(job: Job) -> StorageError:
    return StorageError(f"task {job.task_id} was stored but cannot be read back", kind="error")

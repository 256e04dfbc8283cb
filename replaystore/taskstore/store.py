"""The task store contract: every operation is one atomic step.

Each backend (:mod:`.memory`, :mod:`.redis`) performs each operation under one
lock or in one Lua script, so the rules below hold whatever replicas race:

- a terminal status (``completed``, ``failed``, ``cancelled``) never changes
  again: a late result after a cancel, or a second finisher, is refused;
- ``lastUpdatedAt`` moves only when the task changes;
- input request keys are issued by the store from a per-task counter, so a
  key is never reused during the task's life;
- an answer to a key that is not outstanding (never issued, already answered)
  is ignored; the task stays ``input_required`` until every outstanding
  request is answered;
- the runner holds a lease it renews with :meth:`TaskStore.beat`; once the
  lease lapses, the first replica that reads the task, or that scans the
  running tasks with :meth:`TaskStore.reap`, marks it suspect and gives the
  runner one more lease; if the runner has not renewed by then, the next
  look ends it ``failed`` with :data:`~.records.LOST_ERROR`, so a task is
  never ``working`` forever, read or not. A store that stalls answers no one,
  so the first look comes after the stall and a live runner renews before
  the second: a stall alone never ends a task;
- unless the task was created re-runnable (``attempts`` > 1 and its ``call``
  stored): then a lapsed lease leaves it active for one :meth:`TaskStore.claim`
  to take over, exactly one claimant winning, until ``attempts`` runs have
  started; after that a lapsed lease fails it as above;
- after the task's TTL the store holds nothing of it;
- a client's change that the runner must act on (an answer it waits for, a
  cancel) is also announced to the runner through :meth:`TaskStore.nudges`,
  so it acts at once instead of at its next renewal. The announcement is a
  hint, never the truth: the runner reads the change with its next
  :meth:`TaskStore.beat` either way, so a lost one costs latency only;
- a task created with an owner is invisible to anyone else: every operation
  answers as for an unknown id;
- a task's events (:mod:`.events`) get ``seq`` 0, 1, 2… from the store, in
  the step that appends them: the first is the ``working`` status of its
  creation, and every status change (input required, answered, ended,
  failed as lost, claimed to run again) is appended in the step that makes
  it, so the last event of an ended task is its end. A tool's event is
  appended only while its runner holds the task (the same fence as
  :meth:`TaskStore.finish`), so a runner judged dead can never add to a
  sequence another run continues. Retention (:class:`~.events.EventRetention`,
  fixed at creation) drops the oldest events only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from .events import EventPage, EventRetention
from .records import Beat, Reaped, TaskRecord

__all__ = ["TaskStore"]


class TaskStore(ABC):
    """Durable task records shared by every replica using one store."""

    @abstractmethod
    async def create(
        self,
        task_id: str,
        *,
        runner: str,
        lease: float,
        ttl_ms: int,
        poll_ms: int | None = None,
        owner: str | None = None,
        attempts: int = 1,
        call: Mapping[str, Any] | None = None,
        events: EventRetention | None = None,
    ) -> TaskRecord:
        """Store a new ``working`` task run by ``runner`` (lease of ``lease`` seconds).

        Its events are kept as ``events`` says (the defaults when None); its
        first event, ``seq`` 0, is its ``working`` status.

        Returns once the record is written: a :meth:`get` on any replica
        finds it. ``ValueError`` if the id is taken. With ``call`` (what to
        run again) and ``attempts`` > 1, the task may start that many runs in
        all when runners die (see :meth:`claim`).
        """

    @abstractmethod
    async def get(self, task_id: str, *, owner: str | None = None) -> TaskRecord | None:
        """The task, or None (unknown, expired, or created by another owner).

        A task whose runner's lease lapsed is ended ``failed`` first, in the
        same step.
        """

    @abstractmethod
    async def ask(
        self, task_id: str, runner: str, requests: Sequence[Mapping[str, Any]]
    ) -> list[str] | None:
        """Add outstanding input requests; the task becomes ``input_required``.

        Returns the keys issued for them, in order, or None if the task is
        terminal, gone, or run by another runner.
        """

    @abstractmethod
    async def respond(
        self, task_id: str, answers: Mapping[str, Mapping[str, Any]], *, owner: str | None = None
    ) -> bool:
        """Record answers to outstanding requests (others are ignored).

        The task goes back to ``working`` when none is outstanding any more.
        False if the task is unknown.
        """

    @abstractmethod
    async def cancel(
        self, task_id: str, *, owner: str | None = None, message: str | None = None
    ) -> bool:
        """End the task ``cancelled`` unless it already ended. False if unknown.

        The runner learns it at its next :meth:`beat` (nudged to beat at once,
        see :meth:`nudges`) and stops the tool.
        """

    @abstractmethod
    async def finish(
        self,
        task_id: str,
        status: str,
        *,
        result: Mapping[str, Any] | None = None,
        error: Mapping[str, Any] | None = None,
        message: str | None = None,
        runner: str | None = None,
    ) -> bool:
        """End the task with a terminal ``status``; False if it had already ended (or is gone).

        With ``runner`` (the runner ending its own run): only while that
        runner holds the task, so a run whose task was taken over by another
        replica (its lease judged lapsed) cannot store its end over the new
        run's; and its lease is not judged, since the runner is alive.
        """

    @abstractmethod
    async def beat(self, task_id: str, runner: str, lease: float) -> Beat | None:
        """Renew ``runner``'s lease and take the answers recorded since the last beat.

        None if the task is gone (expired) or another runner holds it. The
        lease is not renewed once the task is terminal. The runner holding the
        task renews it even if its lease lapsed meanwhile (the store stalled):
        it is alive. ``lease`` 0 releases the task: the next look applies the
        lapse rule at once (another replica claims a re-runnable task).
        """

    async def beat_many(
        self, task_ids: Sequence[str], runner: str, lease: float
    ) -> list[Beat | None]:
        """:meth:`beat` for each of ``task_ids``, in order, in as few round trips as possible.

        A replica renews the leases of all the tasks it runs at once. Each task
        is still its own atomic step; a task whose record cannot be read gets
        None, like a task that is gone.
        """
        return [await self.beat(task_id, runner, lease) for task_id in task_ids]

    @abstractmethod
    async def reap(self, *, limit: int = 100, hide: float = 5.0) -> Reaped:
        """Apply the lapse rule to running tasks whose lease may have lapsed.

        Each checked task is one atomic step, the same rule a reader applies,
        so replicas scanning at once agree on one outcome per task. Which tasks
        are worth checking comes from an index of running tasks that is only
        a hint: a stale entry costs one check and is then corrected or
        dropped. Up to ``limit`` tasks per call; the tasks a call checks are
        hidden from other scans for ``hide`` seconds, so a scanner that dies
        midway delays them by that much at most.
        """

    @abstractmethod
    async def claim(
        self,
        task_id: str,
        runner: str,
        lease: float,
        *,
        tools: Collection[str] | None = None,
        grace: float = 0.0,
    ) -> dict[str, Any] | None:
        """Take over a re-runnable task whose runner's lease lapsed; return its stored ``call``.

        In one atomic step: the task must be active, its lease lapsed, and
        fewer than its ``attempts`` runs started. ``runner`` then holds the
        lease, the run count grows, the task is ``working`` with nothing
        outstanding (the new run asks again). None otherwise, so of replicas
        racing for one task exactly one gets the call.

        ``tools``: the tools the claimant can run again. A task whose call
        names another tool is left (None) to a replica that serves it, until
        its lease has been lapsed for ``grace`` seconds: replicas of one app
        need not serve the same tools (during an upgrade, or by mistake), and
        the one that claims must be one that can run it. After the grace,
        any replica claims it, so that a task no replica serves any more
        still ends (failed as lost) instead of staying active.
        """

    @abstractmethod
    async def emit(self, task_id: str, runner: str, blob: bytes, *, key: str = "") -> int | None:
        """Append a tool's event (``blob`` from :func:`~.events.event_blob`); its ``seq``.

        None, and nothing stored, unless ``runner`` holds the task and it has
        not ended. The lease is not judged: the runner asking is alive.
        ``key`` names this append for the runner: sent again (the reply was
        lost), the append that was stored under it is answered, not repeated.
        """

    @abstractmethod
    async def events(
        self, task_id: str, *, owner: str | None = None, start: int | None = None, limit: int = 100
    ) -> EventPage | None:
        """The task's event facts and its retained events from ``seq`` ``start`` on (one step).

        ``start`` None: from the earliest retained. At most ``limit`` events.
        None if the task is unknown, expired or another owner's (as :meth:`get`);
        a lapsed lease is judged first, as by :meth:`get`.
        """

    @asynccontextmanager
    async def event_wakeups(self, task_id: str, wake: Callable[[], None]) -> AsyncIterator[None]:
        """While open, call ``wake()`` soon after an event of ``task_id`` is appended anywhere.

        Entered before a reader reads the store, so an event appended after
        that read still wakes it. A hint only: a reader still reads the store
        on a timer, so a lost wake-up (or a store that sends none, this
        default) costs latency, never an event. ``wake`` must not block.
        """
        yield

    @asynccontextmanager
    async def nudges(self, runner: str, nudge: Callable[[str], None]) -> AsyncIterator[None]:
        """While open, call ``nudge(task_id)`` when a client changes a task ``runner`` runs.

        Called after an answer was recorded (:meth:`respond`) or the task was
        cancelled, so the runner beats at once and the tool gets its answer,
        or is stopped, without waiting for its next renewal. Best effort: a
        store that cannot announce changes (this default) or loses an
        announcement only makes the runner wait for its next :meth:`beat`.
        ``nudge`` must not block.
        """
        yield

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release what the store holds (nothing by default: the backend owns the client)."""

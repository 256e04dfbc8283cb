"""The tasks a replica runs, their leases, and the scan for tasks whose runner died.

Two background jobs of every replica serving tasks
(:class:`~replaystore.mcp.tasks.ReplayTasks`):

- :func:`renew` keeps the leases of the tasks running here: every check
  interval, one store round trip for all of them (one atomic step per task
  inside it), which also hands each run the input answers recorded on any
  replica and stops the tool of a task that ended elsewhere (cancelled, lost
  while this replica stalled, expired). A client's answer or cancel, on any
  replica, also nudges it (:meth:`~replaystore.taskstore.TaskStore.nudges`): it
  then beats those tasks at once, so the tool gets its answer, or stops, in
  about a round trip rather than up to a check interval later;
- :func:`scan` looks for tasks whose runner stopped renewing, on any replica:
  the store applies to each the rule a reader applies (the task ends
  ``failed``, or a re-runnable one is left for a claim), and the scan hands
  each re-runnable one to ``take_over``. It sleeps until the earliest lease
  the store knows of may lapse, and never longer than this replica's lease,
  so a task ends a moment after its lease lapses whether or not anyone reads
  it, and an idle replica costs the store one call per lease.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel

from ...backends.outages import OutageLog
from ...errors import StorageError
from ...taskstore import TERMINAL, Beat, TaskStore

__all__ = ["Nudged", "Run", "renew", "renewal_log", "scan"]

logger = logging.getLogger("replaystore.mcp.tasks")

#: Tasks one scan checks at most before it looks again.
SCAN_BATCH = 100

#: Added to a scan's wait, so it wakes just after a lease lapses, not just before.
_SLACK = 0.01


@dataclass(eq=False)
class Run:
    """One task running on this replica."""

    task_id: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    waiting: dict[str, anyio.Event] = field(default_factory=dict)
    ended: bool = False  # the store says the task is over (cancelled, lost, expired)
    done: bool = False  # the tool returned: its end is being stored, renewals no longer apply
    rerunnable: bool = False  # an idempotent tool's: another replica may run it again
    emitted: int = 0  # the task events this run appended: each append's key, sent again on a retry


class Nudged:
    """The tasks a client changed since the last beat: beat them now, not at the next interval."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._event = anyio.Event()

    def __call__(self, task_id: str) -> None:
        """Called by the store, from any task of this event loop; never blocks."""
        self._ids.add(task_id)
        self._event.set()

    async def until(self, deadline: float) -> set[str]:
        """The nudged task ids once there are some, or an empty set at ``deadline``."""
        if not self._ids:
            with anyio.CancelScope(deadline=deadline):
                await self._event.wait()
        ids, self._ids = self._ids, set()
        self._event = anyio.Event()
        return ids


def renewal_log(clock: Callable[[], float] = anyio.current_time) -> OutageLog:
    """The log of failed renewals: they run every check interval, a line each would flood it."""
    return OutageLog(logger, "lease renewal of running tasks", clock=clock)


async def renew(
    store: TaskStore,
    runs: Mapping[str, Run],
    runner: str,
    lease: float,
    interval: float,
    nudged: Nudged | None = None,
    failures: OutageLog | None = None,
) -> None:
    """Renew the leases of ``runs`` (held by ``runner``), all in one store call per interval.

    Between intervals, the tasks ``nudged`` names are beaten as soon as they
    are named. Failed renewals are logged through ``failures``.
    """
    nudged = nudged or Nudged()
    failures = failures or renewal_log()
    due = anyio.current_time() + interval
    while True:
        ids = await nudged.until(due)
        if anyio.current_time() >= due:
            due = anyio.current_time() + interval
            current = [run for run in runs.values() if not run.done]
            await _beat(store, current, runner, lease, failures)
        elif ids:
            current = [runs[i] for i in ids if i in runs and not runs[i].done]
            await _beat(store, current, runner, lease, failures)


async def _beat(
    store: TaskStore,
    current: list[Run],
    runner: str,
    lease: float,
    failures: OutageLog | None = None,
) -> None:
    """One store round trip: renew the leases of ``current``, hand over what changed."""
    if not current:
        return
    failures = failures or renewal_log()
    try:
        beats = await store.beat_many([run.task_id for run in current], runner, lease)
    except StorageError as exc:
        failures.failed(f"{exc} ({len(current)} task(s) running here)")
        return
    except Exception:  # never let one bad reply stop every renewal
        logger.exception("lease renewal of %d task(s) failed", len(current))
        return
    failures.succeeded()
    for run, beat in zip(current, beats, strict=True):
        _renewed(run, beat)


def _renewed(run: Run, beat: Beat | None) -> None:
    """Hand over answers; stop the tool once the task is over (or no longer its own)."""
    if run.done:  # the tool returned meanwhile: its own end is being stored
        return
    if beat is None or beat.status in TERMINAL:
        run.ended = True
        run.scope.cancel()
        return
    for key, answer in beat.answers.items():
        run.answers[key] = answer
        event = run.waiting.pop(key, None)
        if event is not None:
            event.set()


async def scan(
    store: TaskStore, lease: float, take_over: Callable[[str], Awaitable[object]]
) -> None:
    """End the tasks whose runner died; hand the re-runnable ones to ``take_over``."""
    while True:
        delay = lease
        try:
            reaped = await store.reap(limit=SCAN_BATCH, hide=lease)
            for task_id in reaped.failed:
                logger.info("task %s: its runner stopped; failed as lost", task_id)
            for task_id in reaped.orphaned:
                await take_over(task_id)
            if reaped.next_in is not None:
                delay = min(delay, reaped.next_in + _SLACK if reaped.next_in else 0.0)
        except StorageError as exc:
            logger.warning("scan for tasks whose runner stopped failed: %s", exc)
        except Exception:  # never let one bad record stop the scans
            logger.exception("scan for tasks whose runner stopped failed")
        if delay:
            await anyio.sleep(delay)
        else:
            await anyio.lowlevel.checkpoint()

"""Tasks in process memory, shared by every replica using one ``memory://NAME`` store.

Each operation runs under one lock, with no await inside, so it is as atomic
as a Lua script on Redis. Values are stored in their packed form, exactly as
on Redis: a size limit or an unencodable value fails the same way on both.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ...taskstore.events import (
    EventPage,
    EventRetention,
    decode_event,
    encode_event,
    encode_status,
)
from ...taskstore.records import (
    ACTIVE,
    CANCELLED,
    FAILED,
    INPUT_REQUIRED,
    LOST_ERROR,
    OUTAGE_ERROR,
    TERMINAL,
    WORKING,
    Beat,
    Reaped,
    TaskRecord,
    pack,
    unpack,
)
from ...taskstore.store import TaskStore
from ..notifications import hint

__all__ = ["MemoryTaskStore"]

# Expired tasks are swept every so many operations, so memory stays bounded
# even for tasks nobody reads again.
_SWEEP_EVERY = 256


@dataclass
class _Task:
    status: str
    created: int
    updated: int
    ttl: int
    poll: int | None
    owner: str | None
    runner: str
    lease_until: int
    message: str | None = None
    result: bytes | None = None
    error: bytes | None = None
    issued: int = 0
    outstanding: dict[str, bytes] = field(default_factory=dict)
    answers: dict[str, bytes] = field(default_factory=dict)
    call: bytes | None = None  # the tools/call to run again, for a re-runnable task
    runs: int = 1
    max_runs: int = 1
    lease_ms: int = 0  # the runner's lease: the grace a suspect lapse gets (0: none)
    suspect: bool = False  # a lapse was seen; the next one is judged
    unseen: bool = False  # that lapse was seen more than a lease late: the store was out
    task_id: str = ""
    # Its events: the retained ones, in their stored form, seq next_seq - len(events) on.
    events: list[bytes] = field(default_factory=list)
    next_seq: int = 0
    retention: EventRetention = field(default_factory=EventRetention)
    events_until: int | None = None  # when the events of an ended task go
    last_append: tuple[str, int] = ("", 0)  # the runner's key of the last tool event, its seq

    def orphaned(self, now: int) -> bool:
        """Its runner's lease lapsed, and another run may claim it."""
        return (
            self.status in ACTIVE
            and self.lease_until <= now
            and self.call is not None
            and self.runs < self.max_runs
        )

    def record(self, task_id: str, now: int) -> TaskRecord:
        return TaskRecord(
            task_id=task_id,
            status=self.status,
            created_ms=self.created,
            updated_ms=self.updated,
            ttl_ms=self.ttl,
            poll_ms=self.poll,
            message=self.message,
            result=unpack(self.result) if self.result is not None else None,
            error=unpack(self.error) if self.error is not None else None,
            input_requests={k: unpack(v) for k, v in self.outstanding.items()},
            rerun=self.orphaned(now),
        )


class _Shared:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tasks: dict[str, _Task] = {}
        # The tasks running, in creation order: what a scan looks at. Every
        # end removes its task, so this holds running tasks only.
        self.running: dict[str, None] = {}
        self.ops = 0
        # Runner -> the callbacks its replicas registered with nudges().
        self.nudges: dict[str, list[Callable[[str], None]]] = {}
        # Task id -> the callbacks of the readers waiting for its events.
        self.watchers: dict[str, list[Callable[[], None]]] = {}


# Scope -> namespace -> the tasks of that namespace in that store.
_STORES: weakref.WeakKeyDictionary[object, dict[str, _Shared]] = weakref.WeakKeyDictionary()
_STORES_LOCK = threading.Lock()


def _announce(nudges: Sequence[Callable[[str], None]], task_id: str) -> None:
    """Call each runner callback (outside the lock: a callback may use the store)."""
    for nudge in nudges:  # a hint: the runner's next beat reads the change anyway
        hint(nudge, task_id, about=f"nudging the runner of task {task_id}")


def _now_ms() -> int:
    return int(time.time() * 1000)


class MemoryTaskStore(TaskStore):
    """Tasks of one in-process store; ``scope`` is the object every replica shares.

    Stores made with the same ``scope`` (the backend's
    :class:`~replaystore.backends.memory.InProcess` scope) and the same
    ``namespace`` see the same tasks; another namespace of that scope is
    another set of tasks (the tasks of another app); with no scope the store
    is private.
    """

    def __init__(
        self,
        scope: object | None = None,
        *,
        namespace: str = "",
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        if scope is None:
            self._shared = _Shared()
        else:
            with _STORES_LOCK:
                spaces = _STORES.get(scope)
                if spaces is None:
                    spaces = _STORES[scope] = {}
                shared = spaces.get(namespace)
                if shared is None:
                    shared = spaces[namespace] = _Shared()
            self._shared = shared
        self._clock = clock

    def _live(self, task_id: str, now: int, *, judge: bool = True) -> _Task | None:
        """The task if it has not outlived its TTL; a lapsed lease ends it ``failed``.

        ``judge`` False: the lease is not judged (the runner holding the task
        is asking: it is alive).
        """
        shared = self._shared
        shared.ops += 1
        if shared.ops % _SWEEP_EVERY == 0:
            for key in [k for k, t in shared.tasks.items() if t.created + t.ttl <= now]:
                del shared.tasks[key]
                shared.running.pop(key, None)
        task = shared.tasks.get(task_id)
        if task is None:
            return None
        if task.created + task.ttl <= now:
            del shared.tasks[task_id]
            shared.running.pop(task_id, None)
            return None
        if not judge:
            return task
        if task.status in ACTIVE and task.lease_until <= now and task.lease_ms and not task.suspect:
            # The first look at a lapse: one more lease for the runner to renew
            # (a store stall delays every look until after it; see the Redis rule).
            task.suspect = True
            task.unseen = now - task.lease_until > task.lease_ms
            task.lease_until = now + task.lease_ms
        if task.status in ACTIVE and task.lease_until <= now and not task.orphaned(now):
            error = OUTAGE_ERROR if task.unseen else LOST_ERROR
            self._end(task, FAILED, now, error=pack(error), message=error["message"])
            shared.running.pop(task_id, None)
        return task

    def _end(
        self,
        task: _Task,
        status: str,
        now: int,
        *,
        result: bytes | None = None,
        error: bytes | None = None,
        message: str | None = None,
    ) -> None:
        task.status = status
        task.updated = max(now, task.updated)
        task.result = result
        task.error = error
        if message is not None:
            task.message = message
        task.outstanding.clear()
        task.answers.clear()
        self._status_event(task, now)
        after = task.retention.terminal_ms
        task.events_until = None if after < 0 else now + after

    def _status_event(self, task: _Task, now: int) -> None:
        """Append the task's status as an event, in the step that set it."""
        self._append(task, encode_status(now, task.status, task.runs, task.message), now)

    def _append(self, task: _Task, entry: bytes, now: int) -> int:
        """Append one event (its ``seq`` is the next), apply retention, wake the readers."""
        seq = task.next_seq
        task.events.append(entry)
        task.next_seq += 1
        self._trim(task, now)
        for wake in self._shared.watchers.get(task.task_id, ()):
            # A hint: the reader reads the store on a timer anyway.
            hint(wake, about=f"waking a reader of task {task.task_id}")
        return seq

    @staticmethod
    def _trim(task: _Task, now: int) -> None:
        """Drop the events retention no longer keeps: the oldest only, so the range stays whole."""
        if task.events_until is not None and now >= task.events_until:
            task.events.clear()
            return
        drop = max(0, len(task.events) - task.retention.max_events)
        age = task.retention.age_ms
        if age:
            while drop < len(task.events) and int(task.events[drop].split(b":", 1)[0]) <= now - age:
                drop += 1
        if drop:
            del task.events[:drop]

    def _visible(self, task_id: str, owner: str | None, now: int) -> _Task | None:
        task = self._live(task_id, now)
        if task is None or (task.owner is not None and task.owner != owner):
            return None
        return task

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
        call_blob = pack(call) if call is not None else None
        with self._shared.lock:
            now = self._clock()
            if self._live(task_id, now) is not None:
                raise ValueError(f"task id {task_id!r} is taken")
            task = _Task(
                status=WORKING,
                created=now,
                updated=now,
                ttl=ttl_ms,
                poll=poll_ms,
                owner=owner,
                runner=runner,
                lease_until=now + int(lease * 1000),
                lease_ms=int(lease * 1000),
                call=call_blob,
                max_runs=max(1, attempts),
                task_id=task_id,
                retention=events if events is not None else EventRetention(),
            )
            self._status_event(task, now)
            self._shared.tasks[task_id] = task
            self._shared.running[task_id] = None
            return task.record(task_id, now)

    async def get(self, task_id: str, *, owner: str | None = None) -> TaskRecord | None:
        with self._shared.lock:
            now = self._clock()
            task = self._visible(task_id, owner, now)
            return None if task is None else task.record(task_id, now)

    async def ask(
        self, task_id: str, runner: str, requests: Sequence[Mapping[str, Any]]
    ) -> list[str] | None:
        blobs = [pack(request) for request in requests]
        with self._shared.lock:
            now = self._clock()
            task = self._live(task_id, now, judge=False)
            if task is None or task.status in TERMINAL or task.runner != runner:
                return None
            keys = []
            for blob in blobs:
                task.issued += 1
                key = f"r{task.issued}"
                task.outstanding[key] = blob
                keys.append(key)
            if keys:
                task.status = INPUT_REQUIRED
                task.updated = max(now, task.updated)
                self._status_event(task, now)
            return keys

    async def respond(
        self, task_id: str, answers: Mapping[str, Mapping[str, Any]], *, owner: str | None = None
    ) -> bool:
        blobs = {key: pack(answer) for key, answer in answers.items()}
        nudges: list[Callable[[str], None]] = []
        with self._shared.lock:
            now = self._clock()
            task = self._visible(task_id, owner, now)
            if task is None:
                return False
            taken = [key for key in blobs if key in task.outstanding]
            for key in taken:
                del task.outstanding[key]
                task.answers[key] = blobs[key]
            if taken:
                if not task.outstanding:
                    task.status = WORKING
                    self._status_event(task, now)
                task.updated = max(now, task.updated)
                nudges = list(self._shared.nudges.get(task.runner, ()))
        _announce(nudges, task_id)
        return True

    async def cancel(
        self, task_id: str, *, owner: str | None = None, message: str | None = None
    ) -> bool:
        with self._shared.lock:
            now = self._clock()
            task = self._visible(task_id, owner, now)
            if task is None:
                return False
            if task.status not in ACTIVE:
                return True
            self._end(task, CANCELLED, now, message=message)
            self._shared.running.pop(task_id, None)
            nudges = list(self._shared.nudges.get(task.runner, ()))
        _announce(nudges, task_id)
        return True

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
        if status not in TERMINAL:
            raise ValueError(f"not a terminal status: {status!r}")
        result_blob = pack(result) if result is not None else None
        error_blob = pack(error) if error is not None else None
        with self._shared.lock:
            now = self._clock()
            task = self._live(task_id, now, judge=runner is None)
            if task is None or task.status in TERMINAL:
                return False
            if runner is not None and task.runner != runner:
                return False  # taken over: this run's end is not the task's
            self._end(task, status, now, result=result_blob, error=error_blob, message=message)
            self._shared.running.pop(task_id, None)
            return True

    @asynccontextmanager
    async def nudges(self, runner: str, nudge: Callable[[str], None]) -> AsyncIterator[None]:
        with self._shared.lock:
            self._shared.nudges.setdefault(runner, []).append(nudge)
        try:
            yield
        finally:
            with self._shared.lock:
                registered = self._shared.nudges.get(runner, [])
                if nudge in registered:
                    registered.remove(nudge)
                if not registered:
                    self._shared.nudges.pop(runner, None)

    async def beat(self, task_id: str, runner: str, lease: float) -> Beat | None:
        with self._shared.lock:
            now = self._clock()
            task = self._live(task_id, now, judge=False)
            if task is None or task.runner != runner:
                return None
            if task.status in TERMINAL:
                return Beat(task.status)
            task.lease_ms = int(lease * 1000)
            task.lease_until = now + task.lease_ms
            # Renewed: no longer suspect; a release (lease 0) is suspect at once.
            task.suspect = not task.lease_ms
            task.unseen = False
            if not task.lease_ms and task.call is not None:
                task.max_runs += 1  # a run handed over is no failed attempt
            answers = {key: unpack(blob) for key, blob in task.answers.items()}
            task.answers.clear()
            return Beat(task.status, answers)

    async def beat_many(
        self, task_ids: Sequence[str], runner: str, lease: float
    ) -> list[Beat | None]:
        return [await self.beat(task_id, runner, lease) for task_id in task_ids]

    async def reap(self, *, limit: int = 100, hide: float = 5.0) -> Reaped:
        reaped = Reaped()
        shared = self._shared
        with shared.lock:
            now = self._clock()
            checked = 0
            nearest: int | None = None
            for task_id in list(shared.running):
                task = shared.tasks.get(task_id)
                if task is None or task.status in TERMINAL:
                    shared.running.pop(task_id, None)
                    continue
                if task.lease_until > now:
                    if nearest is None or task.lease_until < nearest:
                        nearest = task.lease_until
                    continue
                if checked == limit:
                    nearest = now  # more are due: scan again at once
                    continue
                checked += 1
                live = self._live(task_id, now)
                if live is None or live.status in TERMINAL:
                    shared.running.pop(task_id, None)
                    if live is not None and live.status == FAILED:
                        reaped.failed.append(task_id)
                elif live.orphaned(now):
                    reaped.orphaned.append(task_id)
                elif nearest is None or live.lease_until < nearest:
                    nearest = live.lease_until  # suspect: judged when its grace ends
        if nearest is not None:
            reaped = Reaped(reaped.failed, reaped.orphaned, max(0, nearest - now) / 1000)
        elif reaped.orphaned:
            reaped = Reaped(reaped.failed, reaped.orphaned, hide)
        return reaped

    async def claim(
        self,
        task_id: str,
        runner: str,
        lease: float,
        *,
        tools: Collection[str] | None = None,
        grace: float = 0.0,
    ) -> dict[str, Any] | None:
        with self._shared.lock:
            now = self._clock()
            task = self._live(task_id, now)
            if task is None or task.call is None or not task.orphaned(now):
                return None
            if (
                tools is not None
                and unpack(task.call).get("name") not in tools
                and now < task.lease_until + int(grace * 1000)
            ):
                return None
            task.runner = runner
            task.lease_ms = int(lease * 1000)
            task.lease_until = now + task.lease_ms
            task.suspect = False
            task.unseen = False
            task.runs += 1
            task.status = WORKING
            task.outstanding.clear()
            task.answers.clear()
            task.updated = max(now, task.updated)
            self._status_event(task, now)
            return unpack(task.call)

    async def emit(self, task_id: str, runner: str, blob: bytes, *, key: str = "") -> int | None:
        with self._shared.lock:
            now = self._clock()
            task = self._live(task_id, now, judge=False)
            if task is None or task.runner != runner or task.status in TERMINAL:
                return None
            named = f"{runner}:{key}"
            if key and task.last_append[0] == named:
                return task.last_append[1]  # sent again: stored already
            seq = self._append(task, encode_event(now, blob), now)
            task.last_append = (named, seq)
            return seq

    async def events(
        self, task_id: str, *, owner: str | None = None, start: int | None = None, limit: int = 100
    ) -> EventPage | None:
        with self._shared.lock:
            now = self._clock()
            task = self._visible(task_id, owner, now)
            if task is None:
                return None
            self._trim(task, now)
            floor = task.next_seq - len(task.events)
            first = floor if start is None else max(start, floor)
            last = min(task.next_seq, first + max(0, limit))
            events = [decode_event(seq, task.events[seq - floor]) for seq in range(first, last)]
            return EventPage(floor, task.next_seq, task.status, events, task.orphaned(now))

    @asynccontextmanager
    async def event_wakeups(self, task_id: str, wake: Callable[[], None]) -> AsyncIterator[None]:
        with self._shared.lock:
            self._shared.watchers.setdefault(task_id, []).append(wake)
        try:
            yield
        finally:
            with self._shared.lock:
                waiting = self._shared.watchers.get(task_id, [])
                if wake in waiting:
                    waiting.remove(wake)
                if not waiting:
                    self._shared.watchers.pop(task_id, None)

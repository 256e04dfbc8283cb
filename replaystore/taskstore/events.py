"""A task's events: what the store keeps of them, their retention, their stored form.

Each task has one sequence of events, ``seq`` 0, 1, 2… issued by the store in
the step that appends the event, so two events can never share a ``seq``
whoever appends (a runner that died and the one that runs the task again
included: an append is fenced by the runner's hold on the task). The store
keeps the retained events as one contiguous range ``[floor, next)``: dropping
old ones (count, age, the task's end) only moves ``floor`` up, so the two
numbers and the range, read in one atomic step, are all a cursor is judged
on (:func:`~replaystore.taskstore.sep2694.judge_cursor`).

Stored form (the same bytes on every backend), one entry per event:
``<ms>:e:<type>\\n<msgpack payload>`` for an event a tool emitted, and
``<ms>:s:<status>:<attempt>:<message>`` for a status change, written by the
store's own scripts in the step that changes the status (so a stream and
``tasks/get`` never disagree on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .records import LOST_ERROR, OUTAGE_ERROR, TERMINAL, TaskInputError, pack, unpack
from .sep2694 import STATUS_TYPE, type_problem

__all__ = [
    "EventPage",
    "EventRetention",
    "TaskEvent",
    "TaskEventError",
    "decode_event",
    "encode_event",
    "encode_status",
    "event_blob",
]


_LOST = b"\x00lost:"


class TaskEventError(TaskInputError):
    """An event a tool may not emit: an unprefixed type, a payload no JSON object, too large."""


@dataclass(frozen=True, slots=True)
class EventRetention:
    """How long a task's events are kept, and how large one may be.

    ``max_events``: events kept per task (the oldest dropped first);
    ``max_age``: seconds an event is kept after it was emitted (None: as long
    as the task); ``after_terminal``: seconds events are kept once the task
    has ended (None: as long as the task); ``max_payload``: the largest
    payload, in packed (msgpack) bytes. Events never outlive their task.
    """

    max_events: int = 1000
    max_age: float | None = None
    after_terminal: float | None = None
    max_payload: int = 64 * 1024

    def __post_init__(self) -> None:
        if not 1 <= self.max_events <= 1_000_000:
            raise ValueError("max_events is between 1 and 1000000")
        if self.max_age is not None and not 0 < self.max_age <= 366 * 86400:
            raise ValueError("max_age is between 0 and 366 days (seconds)")
        if self.after_terminal is not None and not 0 <= self.after_terminal <= 366 * 86400:
            raise ValueError("after_terminal is between 0 and 366 days (seconds)")
        if not 2 <= self.max_payload <= 1 << 20:
            raise ValueError("max_payload is between 2 bytes and 1 MiB")

    @property
    def age_ms(self) -> int:
        """``max_age`` in ms; 0 for none."""
        return 0 if self.max_age is None else max(1, int(self.max_age * 1000))

    @property
    def terminal_ms(self) -> int:
        """``after_terminal`` in ms; -1 for none."""
        return -1 if self.after_terminal is None else int(self.after_terminal * 1000)


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One event of a task, as delivered."""

    seq: int
    type: str
    payload: dict[str, Any]
    at_ms: int


@dataclass(frozen=True, slots=True)
class EventPage:
    """One atomic read of a task's events: the facts a cursor is judged on, and events.

    ``floor``: the earliest ``seq`` retained (``next_seq`` when none is);
    ``next_seq``: the ``seq`` of the next event; ``status``: the task's status
    in the same step; ``events``: retained events from the asked ``seq`` on,
    in order, at most the asked number; ``rerun``: the runner's lease lapsed
    on a re-runnable task (a reader may claim it, as after ``tasks/get``).
    """

    floor: int
    next_seq: int
    status: str
    events: list[TaskEvent] = field(default_factory=list)
    rerun: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


def event_blob(event_type: str, payload: object, retention: EventRetention) -> bytes:
    """The stored form of a tool's event, without its time; :class:`TaskEventError` if refused."""
    problem = type_problem(event_type)
    if problem is not None:
        raise TaskEventError(problem)
    if not isinstance(payload, dict) or not all(isinstance(k, str) for k in payload):
        raise TaskEventError("an event payload is a JSON object")
    try:
        packed = pack(payload)
    except TaskInputError as exc:
        raise TaskEventError(f"the event payload cannot be stored: {exc}") from None
    if len(packed) > retention.max_payload:
        raise TaskEventError(
            f"the event payload is {len(packed)} bytes packed, "
            f"more than the {retention.max_payload} a task event may hold"
        )
    return event_type.encode() + b"\n" + packed


def encode_event(at_ms: int, blob: bytes) -> bytes:
    """A tool's event as stored (``blob`` from :func:`event_blob`)."""
    return b"%d:e:" % at_ms + blob


def encode_status(at_ms: int, status: str, attempt: int, message: str | None) -> bytes:
    """A status change as stored (what the Redis scripts write, for the memory store)."""
    return b"%d:s:%s:%d:%s" % (at_ms, status.encode(), attempt, (message or "").encode())


def decode_event(seq: int, entry: bytes) -> TaskEvent:
    """An event from its stored form."""
    at, kind, rest = entry.split(b":", 2)
    if kind == b"e":
        event_type, _, blob = rest.partition(b"\n")
        return TaskEvent(seq, event_type.decode(), unpack(blob), int(at))
    status, attempt, message = rest.split(b":", 2)
    payload: dict[str, Any] = {"status": status.decode()}
    if message.startswith(_LOST):  # failed as lost: the flag names the error (Redis scripts)
        payload["statusMessage"] = (OUTAGE_ERROR if message == _LOST + b"2" else LOST_ERROR)[
            "message"
        ]
    elif message:
        payload["statusMessage"] = message.decode("utf-8", "replace")
    if int(attempt) > 1:
        payload["attempt"] = int(attempt)
    return TaskEvent(seq, STATUS_TYPE, payload, int(at))

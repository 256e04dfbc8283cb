"""Everything that depends on the wording of SEP-2694 "Resumable Task Event Streams" (a draft).

The draft may still change; its names, codes and rules are kept here, so a
change of the draft is a change of this module. The rest of the package asks
this module what to call a method, how to judge a cursor, what an event looks
like on the wire, and which event types may be emitted.

The draft's rules as applied here:

- ``tasks/stream {taskId, after?}``; events go out as ``notifications/tasks/event``
  on that request's response, ``seq`` per task from 0, +1 each, in order;
- ``after`` is exclusive and a non-negative integer; a negative value, a value
  that is not an integer (a float, a boolean, a string, ``null``) or one beyond
  the last ``seq`` issued is invalid params (-32602);
- ``after`` omitted: from the earliest retained event; events after ``after``
  no longer all retained: the error -32010 ``events_gone`` with ``earliestSeq``,
  never a stream with a silent gap;
- event types carry a vendor prefix; bare names are reserved for MCP;
- a stream beyond what a receiver allows for one task (the draft: a second
  active stream of a task on one connection) is invalid params (-32602); the
  draft names no ``data`` for it, so this one is ours:
  ``{"reason": "too_many_streams", "taskId", "limit"}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "EVENTS_GONE",
    "EVENTS_GONE_CODE",
    "EVENTS_GONE_MESSAGE",
    "EVENT_NOTIFICATION",
    "MAX_TYPE",
    "OMITTED",
    "PROGRESS_TYPE",
    "RELATED_TASK",
    "STATUS_TYPE",
    "STREAM_CAPABILITY",
    "STREAM_METHOD",
    "TOO_MANY_STREAMS",
    "TOO_MANY_STREAMS_CODE",
    "EventsGone",
    "Invalid",
    "Start",
    "Verdict",
    "cursor_form",
    "event_params",
    "events_gone_data",
    "judge_cursor",
    "too_many_streams",
    "type_problem",
]

#: The request that opens (or resumes) a task's event stream.
STREAM_METHOD: Final = "tasks/stream"
#: The notification carrying one event, on the response of ``tasks/stream``.
EVENT_NOTIFICATION: Final = "notifications/tasks/event"
#: The sub-capability of the tasks extension a server advertises.
STREAM_CAPABILITY: Final = "eventStreams"
#: The ``_meta`` key every event carries: ``{"taskId": ...}``.
RELATED_TASK: Final = "io.modelcontextprotocol/related-task"

#: The error of a cursor below the retained range.
EVENTS_GONE_CODE: Final = -32010
EVENTS_GONE: Final = "events_gone"
EVENTS_GONE_MESSAGE: Final = "Task events are no longer available"

#: The error of a ``tasks/stream`` beyond the streams one client may hold open for a task.
TOO_MANY_STREAMS_CODE: Final = -32602
TOO_MANY_STREAMS: Final = "too_many_streams"

#: This implementation's own event types (its namespace, as the draft asks).
STATUS_TYPE: Final = "dev.replaystore/status"
PROGRESS_TYPE: Final = "dev.replaystore/progress"

#: The longest event type accepted.
MAX_TYPE: Final = 200

_LABEL = r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# ``com.example/step``: a reverse-DNS prefix (two labels or more), a slash, a name.
_SLASHED = re.compile(rf"({_LABEL}(?:\.{_LABEL})+)/[^\s/][^\s]*")
# ``com.example.review.comment``: the draft's dotted form, three labels or more.
_DOTTED = re.compile(rf"({_LABEL}\.{_LABEL})\.[^\s.][^\s]*")


def type_problem(event_type: object) -> str | None:
    """Why ``event_type`` may not be emitted, or None if it may.

    The draft reserves unprefixed names (``content.partial``, ``task.status``)
    for MCP and asks for a vendor prefix, preferably reverse-DNS. A prefix
    cannot be told from a name by its spelling alone, so the accepted forms
    are the unambiguous ones: ``<reverse-dns>/<name>`` (as MCP spells its own
    ``_meta`` keys) or a dotted type of three labels or more
    (``com.example.review.comment``). A prefix whose second label is
    ``modelcontextprotocol`` or ``mcp`` is MCP's own and refused too.
    """
    if not isinstance(event_type, str):
        return "an event type is a string"
    if not event_type or len(event_type) > MAX_TYPE:
        return f"an event type has 1 to {MAX_TYPE} characters"
    match = _SLASHED.fullmatch(event_type) or _DOTTED.fullmatch(event_type)
    if match is None:
        return (
            f"event type {event_type!r} has no vendor prefix: unprefixed types are reserved "
            "for MCP; use a reverse-DNS prefix such as 'com.example/step' or "
            "'com.example.step.done'"
        )
    labels = match.group(1).lower().split(".")
    if labels[1] in ("modelcontextprotocol", "mcp"):
        return f"event type {event_type!r} uses a prefix reserved for MCP"
    return None


@dataclass(frozen=True, slots=True)
class Start:
    """The cursor is good: deliver the events from ``seq`` on (then live ones)."""

    seq: int


@dataclass(frozen=True, slots=True)
class Invalid:
    """The cursor is not a valid ``after`` for this task: -32602 with ``message``."""

    message: str


@dataclass(frozen=True, slots=True)
class EventsGone:
    """Events after the cursor are no longer all retained: -32010 ``events_gone``."""

    earliest: int


Verdict = Start | Invalid | EventsGone

#: ``after`` was not given (distinct from ``null``, which is not an integer).
OMITTED: Final = object()


def cursor_form(after: object) -> Invalid | None:
    """Whether ``after`` (given) has the form of a cursor: a non-negative integer.

    Judged before the store is asked, so a malformed cursor costs no read.
    """
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        return Invalid("after must be a non-negative integer")
    return None


def judge_cursor(after: object, floor: int, next_seq: int) -> Verdict:
    """Judge a ``tasks/stream`` cursor against what the store holds of the task.

    ``after``: the request's value as decoded from JSON, or :data:`OMITTED`.
    ``floor``: the earliest ``seq`` retained (``next_seq`` when none is);
    ``next_seq``: the ``seq`` the next event will get (the last issued + 1).
    Pure: the facts come from one atomic read of the store.
    """
    if not 0 <= floor <= next_seq:
        raise ValueError(f"inconsistent facts: floor {floor}, next {next_seq}")
    if after is OMITTED:
        return Start(floor)
    malformed = cursor_form(after)
    if malformed is not None:
        return malformed
    assert isinstance(after, int)
    if after >= next_seq:
        last = "no event was issued yet" if next_seq == 0 else f"the last is {next_seq - 1}"
        return Invalid(f"after {after} is beyond the last event issued for this task ({last})")
    if after + 1 < floor:
        return EventsGone(floor)
    return Start(after + 1)


def events_gone_data(task_id: str, earliest: int) -> dict[str, Any]:
    """The ``data`` of the -32010 error."""
    return {"reason": EVENTS_GONE, "taskId": task_id, "earliestSeq": earliest}


def event_params(
    task_id: str, seq: int, event_type: str, payload: dict[str, Any]
) -> dict[str, Any]:
    """The ``params`` of one ``notifications/tasks/event``."""
    return {
        "seq": seq,
        "taskId": task_id,
        "type": event_type,
        "payload": payload,
        "_meta": {RELATED_TASK: {"taskId": task_id}},
    }


def too_many_streams(task_id: str, limit: int) -> tuple[str, dict[str, Any]]:
    """The message and ``data`` of the error of a stream beyond ``limit`` for one task.

    The draft allows one active stream per task and connection and answers a
    second with -32602, asking the client to cancel the active one first; on
    a revision where every request is its own exchange, the bound is the
    streams one client holds open for the task, and the answer is the same.
    """
    message = (
        f"too many open tasks/stream requests for this task (at most {limit} per client); "
        "cancel one before opening another"
    )
    return message, {"reason": TOO_MANY_STREAMS, "taskId": task_id, "limit": limit}

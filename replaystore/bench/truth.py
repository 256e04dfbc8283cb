"""Ground truth: every reconnect's answer judged against what was really stored.

The storm records, for every stream, the ids its store returned in append
order (one writer per stream, so that order is the stream's order), and when
each append made during the storm returned. A reconnect is judged against the
stream the client wanted and the last event it really holds:

``exact``
    success, and the events are exactly the ones after the held event: at
    least every event whose append had returned before the resume began, then
    possibly more of the same stream, in order.
``duplicate``
    success, and an event the client already holds (or one event twice).
``loss``
    success, but events the client needed are missing: a silent gap. A success
    on a cursor no store can resume from (a conflated, evicted, ahead or
    foreign cursor) counts here too: the client believes it is in step and is
    not.
``wrong_stream``
    success, with an event of another stream or another session.
``explicit_failure``
    the store said it cannot resume. *Correct* when no exact resumption was
    possible, *incorrect* otherwise.

``incorrect_verdicts`` counts every reconnect whose yes-or-no was wrong: a
failure where an exact resumption was possible, or a success where it was not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .stores import Reply
from .workload import Reconnect

__all__ = ["OUTCOMES", "Tally", "judge"]

OUTCOMES = ("exact", "duplicate", "loss", "wrong_stream", "correct_failure", "incorrect_failure")


def judge(
    reconnect: Reconnect,
    reply: Reply,
    began: float,
    truth: list[str],
    done_at: dict[str, float],
    *,
    possible: bool,
) -> str:
    """The outcome of one reconnect (one of :data:`OUTCOMES`)."""
    if reply.failed:
        return "incorrect_failure" if possible else "correct_failure"
    ids = reply.events or []
    index = {event_id: i for i, event_id in enumerate(truth)}
    if any(event_id not in index for event_id in ids):
        return "wrong_stream"
    held = reconnect.held
    if len(set(ids)) != len(ids) or any(index[event_id] <= held for event_id in ids):
        return "duplicate"
    if not possible:
        return "loss"
    needed = sum(1 for event_id in truth[held + 1 :] if done_at.get(event_id, 0.0) < began)
    if ids == truth[held + 1 : held + 1 + len(ids)] and len(ids) >= needed:
        return "exact"
    return "loss"


@dataclass(slots=True)
class Tally:
    """Outcome counts of one store, overall and per kind of reconnect."""

    outcomes: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    verdicts_by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    events_replayed: int = 0
    incorrect_verdicts: int = 0

    def add(self, reconnect: Reconnect, reply: Reply, outcome: str, *, possible: bool) -> None:
        if reply.failed == possible:  # failed where it could resume, or resumed where it could not
            self.incorrect_verdicts += 1
        self.outcomes[outcome] += 1
        self.by_kind.setdefault(reconnect.kind, Counter())[outcome] += 1
        self.verdicts_by_kind.setdefault(reconnect.kind, Counter())[reply.verdict] += 1
        self.events_replayed += len(reply.events or [])

    @property
    def attempts(self) -> int:
        return sum(self.outcomes.values())

    def as_dict(self) -> dict[str, Any]:
        o = self.outcomes
        return {
            "reconnects": self.attempts,
            "exact": o["exact"],
            "duplicates": o["duplicate"],
            "losses": o["loss"],
            "wrong_stream": o["wrong_stream"],
            "explicit_failures": o["correct_failure"] + o["incorrect_failure"],
            "correct_failures": o["correct_failure"],
            "incorrect_failures": o["incorrect_failure"],
            "incorrect_verdicts": self.incorrect_verdicts,
            "events_replayed": self.events_replayed,
            "outcomes_by_kind": {k: _counts(c) for k, c in sorted(self.by_kind.items())},
            "answers_by_kind": {k: _counts(c) for k, c in sorted(self.verdicts_by_kind.items())},
        }


def _counts(counter: Counter[str]) -> dict[str, int]:
    return dict(sorted(counter.items()))

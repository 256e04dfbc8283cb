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

What the storm promises for replaystore (:func:`storm_targets`,
:func:`http_ratios_and_targets`) is computed here too, from each run against
its yardsticks, and so is a row of the HTTP storm over its rounds
(:func:`over_rounds`: the median of each figure, the counts summed).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .stores import FLOOR, Reply
from .workload import Reconnect

__all__ = [
    "BASELINE",
    "CPU_TARGETS",
    "OUTCOMES",
    "Tally",
    "http_ratios_and_targets",
    "judge",
    "over_rounds",
    "storm_ratios",
    "storm_targets",
]

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


# -- the rounds of the HTTP storm ------------------------------------------------

#: A row's figures that are the median of its rounds' (its counts are summed).
_MEDIANS = (
    "recovery_s",
    "resumes_per_s",
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "replica_cpu_us_per_resume",
    "setup_seconds",
)
_SUMS = (
    "resumes",
    "attempts",
    "appends",
    "setup_retries",
    "reconnects",
    "exact",
    "duplicates",
    "losses",
    "wrong_stream",
    "explicit_failures",
    "correct_failures",
    "incorrect_failures",
    "incorrect_verdicts",
    "events_replayed",
)


def _median(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _summed(counts: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    total: dict[str, Counter[str]] = {}
    for by_kind in counts:
        for kind, outcomes in by_kind.items():
            total.setdefault(kind, Counter()).update(outcomes)
    return {kind: dict(sorted(c.items())) for kind, c in sorted(total.items())}


def over_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One store's row over its rounds: figures the median of the rounds', counts summed.

    A median, not a mean: one round slowed by a neighbour on a shared machine
    moves it little. Each round's own figures stay under ``rounds``, to show
    the spread; a single round is its own row.
    """
    row = dict(runs[0])
    if len(runs) == 1:
        row.pop("order_in_round", None)
        return row
    row.update({key: _median([r[key] for r in runs]) for key in _MEDIANS})
    row.update({key: sum(r[key] for r in runs) for key in _SUMS})
    for key in ("outcomes_by_kind", "answers_by_kind"):
        row[key] = _summed([r[key] for r in runs])
    for key in ("replica_cpu_s", "latency_cdf_ms"):  # per replica, per quantile
        row[key] = [_median(list(v)) for v in zip(*(r[key] for r in runs), strict=True)]
    redis = [r["redis"]["cpu_us_per_resume"] for r in runs if "redis" in r]
    if redis:
        row["redis"] = {"cpu_us_per_resume": _median(redis)}
    row["rounds"] = [
        {
            **{key: r[key] for key in (*_MEDIANS, "duplicates", "losses", "wrong_stream")},
            "redis_cpu_us_per_resume": r.get("redis", {}).get("cpu_us_per_resume"),
            "order_in_round": r["order_in_round"],
            **({"killed": r["killed"]} if "killed" in r else {}),
        }
        for r in runs
    ]
    row.pop("order_in_round")
    return row


# -- the promises -----------------------------------------------------------------
#
# What the storm promises for replaystore, computed from each run against its yardsticks.
#
# The bare storm measures against the raw floor (Redis streams, no checks), the
# HTTP storm against the official SDK's example store behind sticky routing:
# ratios within one run, never absolute figures of one machine.


def storm_ratios(stores: list[dict[str, Any]]) -> dict[str, Any]:
    by = {s["name"]: s for s in stores}
    rs = by.get("replaystore")
    raw = next((s for s in stores if s["name"].startswith("raw")), None)
    if rs is None or raw is None:
        return {}
    out: dict[str, Any] = {"floor": raw["name"]}
    if rs["resumes_per_s"] and raw["resumes_per_s"]:
        out["resumes_per_s_vs_floor"] = round(rs["resumes_per_s"] / raw["resumes_per_s"], 3)
    if rs["appends_per_s"] and raw["appends_per_s"]:
        out["appends_per_s_vs_floor"] = round(rs["appends_per_s"] / raw["appends_per_s"], 3)
    if "redis" in rs and "redis" in raw and raw["redis"]["cpu_us_per_resume"] > 0:
        out["redis_cpu_per_resume_vs_floor"] = round(
            rs["redis"]["cpu_us_per_resume"] / raw["redis"]["cpu_us_per_resume"], 3
        )
        if rs["redis"]["cpu_us_per_resume"] > 0:
            out["resumes_per_redis_cpu_s_vs_floor"] = round(
                raw["redis"]["cpu_us_per_resume"] / rs["redis"]["cpu_us_per_resume"], 3
            )
        if raw["redis"]["cpu_us_per_append"] > 0:
            out["redis_cpu_per_append_vs_floor"] = round(
                rs["redis"]["cpu_us_per_append"] / raw["redis"]["cpu_us_per_append"], 3
            )
    return out


def storm_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures replaystore promises, each with its value and whether it was met."""
    rs = next((s for s in report["stores"] if s["name"] == "replaystore"), None)
    if rs is None:
        return []
    ratios = report["ratios"]
    rows: list[tuple[str, str, Any, bool | None]] = [
        ("duplicates", "0", rs["duplicates"], rs["duplicates"] == 0),
        ("losses", "0", rs["losses"], rs["losses"] == 0),
        ("wrong_stream", "0", rs["wrong_stream"], rs["wrong_stream"] == 0),
        ("incorrect_verdicts", "0", rs["incorrect_verdicts"], rs["incorrect_verdicts"] == 0),
    ]

    def ratio(key: str, label: str, bound: float, at_least: bool) -> None:
        value = ratios.get(key)
        met = None if value is None else (value >= bound if at_least else value <= bound)
        rows.append((label, f"{'>=' if at_least else '<='} {bound}x", value, met))

    ratio("resumes_per_s_vs_floor", "resumes/s vs the raw floor", 0.8, True)
    ratio("redis_cpu_per_resume_vs_floor", "Redis CPU per resume vs the raw floor", 1.8, False)
    return [{"figure": f, "target": t, "value": v, "met": m} for f, t, v, m in rows]


#: The HTTP storm's yardstick: the official SDK's example store behind sticky
#: routing, the smallest deployment people run today.
BASELINE = "sdk-example (sticky)"

#: Replica CPU per resume promised as a ratio in one run: (row, divided by, at most).
CPU_TARGETS = (
    ("replaystore (sticky)", FLOOR, 1.5),
    ("replaystore (round-robin)", FLOOR, 2.0),
    ("replaystore (sticky)", BASELINE, 0.5),
)


def _cpu_ratio(row: dict[str, Any] | None, under: dict[str, Any] | None) -> float | None:
    """``row``'s replica CPU per resume over ``under``'s (None where either is not measured)."""
    if row is None or under is None:
        return None
    mine, theirs = row.get("replica_cpu_us_per_resume"), under.get("replica_cpu_us_per_resume")
    return round(mine / theirs, 3) if mine and theirs else None


def _cpu_ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every row's replica CPU per resume against the floor's; the promised pairs, by round too."""
    by = {r["name"]: r for r in rows}
    out: dict[str, Any] = {}
    if FLOOR in by:
        out["floor"] = FLOOR
        out["replica_cpu_per_resume_vs_floor"] = {r["name"]: _cpu_ratio(r, by[FLOOR]) for r in rows}
    out["replica_cpu_per_resume"] = {
        f"{a} / {b}": _cpu_ratio(by.get(a), by.get(b)) for a, b, _ in CPU_TARGETS
    }
    rounds = max((len(r.get("rounds", [])) for r in rows), default=0)

    def in_round(name: str, n: int) -> dict[str, Any] | None:
        return by[name]["rounds"][n] if name in by else None

    if rounds > 1:
        out["by_round"] = [
            {f"{a} / {b}": _cpu_ratio(in_round(a, n), in_round(b, n)) for a, b, _ in CPU_TARGETS}
            for n in range(rounds)
        ]
    return out


def http_ratios_and_targets(
    rows: list[dict[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """replaystore against the floor and against the SDK's store with sticky routing, in this run.

    The fleet is back when every client has its missed events or its 404
    (``recovery_s``); the CPU is the server replicas' own per resume (with
    rounds, the ratio of the medians). Exactness is asked of both replaystore
    rows. A target is reported met or missed, never enforced.
    """
    by = {r["name"]: r for r in rows}
    rs, base = by.get("replaystore (round-robin)"), by.get(BASELINE)
    ratios: dict[str, Any] = {}
    if rs is not None and base is not None:
        ratios["baseline"] = BASELINE
        if rs["recovery_s"] and base["recovery_s"]:
            ratios["recovery_vs_sdk"] = round(rs["recovery_s"] / base["recovery_s"], 3)
        cpu = _cpu_ratio(rs, base)
        if cpu is not None:
            ratios["replica_cpu_per_resume_vs_sdk"] = cpu
    ratios.update(_cpu_ratios(rows))
    targets: list[dict[str, Any]] = []
    for name in ("replaystore (round-robin)", "replaystore (sticky)"):
        row = by.get(name)
        if row is None:
            continue
        for figure in ("duplicates", "losses", "wrong_stream"):
            value = row[figure]
            targets.append(
                {"figure": f"{name}: {figure}", "target": "0", "value": value, "met": value == 0}
            )
    bounds = [
        (
            "replaystore (round-robin): time until every client is back vs the SDK's store "
            "(sticky)",
            ratios.get("recovery_vs_sdk"),
            1.1,
        ),
        (
            "replaystore (round-robin): replica CPU per resume vs the SDK's store (sticky)",
            ratios.get("replica_cpu_per_resume_vs_sdk"),
            1.2,
        ),
    ]
    for a, b, bound in CPU_TARGETS:
        if a in by and b in by:
            value = ratios["replica_cpu_per_resume"][f"{a} / {b}"]
            bounds.append((f"replica CPU per resume: {a} / {b}", value, bound))
    for figure, value, bound in bounds:
        targets.append(
            {
                "figure": figure,
                "target": f"<= {bound}x",
                "value": value,
                "met": None if value is None else value <= bound,
            }
        )
    return ratios, targets

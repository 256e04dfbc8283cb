"""The verdict rules, in Python, for backends that hold their data in-process.

The Redis backend runs the same rules inside ``backends/lua/resolve.lua``
(they must execute on the server, in the same atomic step as the replay and the
teardown). ``docs/verdicts.md`` is the specification both follow; the
conformance suite runs every case against every backend to keep them equal.

The order of the checks matters and is part of the contract:

1. session unknown -> ``unknown_session``
2. cursor text not a cursor -> ``malformed_cursor``
3. cursor epoch is not the session's -> ``foreign_cursor``
4. a sequence was named and the session has no such sequence -> ``unknown_sequence``
5. cursor position above the session high-water -> ``ahead_of_high_water``
6. origin cursor (position 0): history already evicted -> ``below_floor``;
   no sequence named and more than one sequence -> ``ambiguous_sequence``
7. cursor position below the session floor -> ``below_floor``
8. no event at the cursor position -> ``not_retained``
9. the cursor's event belongs to another sequence than the named one -> ``sequence_mismatch``
10. the chain of the sequence's events after the cursor is broken, or does
    not reach the sequence high-water -> ``not_retained``
11. otherwise ``resumed``, with exactly that chain as the replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .cursor import Cursor
from .verdicts import Evidence, Verdict

__all__ = ["REASONS", "Judgement", "Record", "SequenceState", "SessionView", "judge", "reason"]


@dataclass(slots=True)
class Record:
    """One stored event: ``prev`` is the previous position of the same sequence (0: first)."""

    position: int
    sequence: str
    prev: int
    at: float
    payload: bytes | None


@dataclass(slots=True)
class SequenceState:
    floor: int
    high_water: int
    retained: int


class SessionView(Protocol):
    """What the rules need to read of one session."""

    @property
    def epoch(self) -> str: ...
    @property
    def top(self) -> int: ...
    @property
    def floor(self) -> int: ...
    @property
    def retained(self) -> int: ...
    @property
    def sequences(self) -> dict[str, SequenceState]: ...
    def record(self, position: int) -> Record | None: ...
    def next_in_sequence(self, position: int) -> int | None: ...


#: Why a verdict was reached, by short code. The Lua scripts report the same
#: codes, so the human text lives only here.
REASONS: dict[str, str] = {
    "resumed": "continuity proven from the cursor to the sequence high-water",
    "origin_empty": "nothing has been issued yet",
    "no_session": "the session does not exist",
    "invalid_session": "not a valid session id",
    "closed": "the session was closed",
    "torn_down": "the session was torn down after a failed resumption",
    "malformed": "the cursor is not of the form <epoch>-<position>",
    "foreign": "the cursor was issued by another session or an earlier incarnation of this one",
    "unknown_sequence": "the session has no retained sequence of that name",
    "ahead": "the cursor is ahead of the last issued position (stale replica or reordering proxy)",
    "origin_evicted": "events since the origin have been evicted",
    "origin_ambiguous": "the origin cursor names no sequence and the session has several",
    "evicted": "the cursor's event has been evicted (never clamp to the floor)",
    "missing_event": "no event is retained at the cursor position",
    "mismatch": "the cursor's event belongs to another sequence than the one named",
    "no_sequence_state": "the cursor's sequence has no bookkeeping",
    "chain_broken": "the sequence's chain of events after the cursor is broken",
    "chain_short": "the sequence's retained events do not reach its high-water",
}


def reason(code: str) -> str:
    return REASONS.get(code, code)


@dataclass(slots=True)
class Judgement:
    verdict: Verdict
    code: str
    sequence: str | None
    chain: list[Record]
    cursor_sequence: str | None = None

    @property
    def reason(self) -> str:
        return reason(self.code)


def judge(view: SessionView, cursor: Cursor | None, named: str | None) -> Judgement:
    """Apply checks 2-11 (the caller has established that the session exists)."""

    def fail(verdict: Verdict, code: str, cursor_sequence: str | None = None) -> Judgement:
        return Judgement(verdict, code, named, [], cursor_sequence)

    if cursor is None:
        return fail(Verdict.MALFORMED_CURSOR, "malformed")
    if cursor.epoch != view.epoch:
        return fail(Verdict.FOREIGN_CURSOR, "foreign")
    if named is not None and named not in view.sequences:
        return fail(Verdict.UNKNOWN_SEQUENCE, "unknown_sequence")
    p = cursor.position
    if p > view.top:
        return fail(Verdict.AHEAD_OF_HIGH_WATER, "ahead")
    if p == 0:
        if view.floor > 1:
            return fail(Verdict.BELOW_FLOOR, "origin_evicted")
        if named is None:
            if len(view.sequences) > 1:
                return fail(Verdict.AMBIGUOUS_SEQUENCE, "origin_ambiguous")
            if not view.sequences:
                return Judgement(Verdict.RESUMED, "origin_empty", None, [])
            named = next(iter(view.sequences))
        start = view.sequences[named].floor
        return _walk(view, named, start, 0)
    if p < view.floor:
        return fail(Verdict.BELOW_FLOOR, "evicted")
    record = view.record(p)
    if record is None:
        return fail(Verdict.NOT_RETAINED, "missing_event")
    if named is not None and record.sequence != named:
        return fail(Verdict.SEQUENCE_MISMATCH, "mismatch", record.sequence)
    sequence = record.sequence
    if sequence not in view.sequences:
        return fail(Verdict.NOT_RETAINED, "no_sequence_state", sequence)
    return _walk(view, sequence, view.next_in_sequence(p), p)


def _walk(view: SessionView, sequence: str, start: int | None, prev: int) -> Judgement:
    """Follow the sequence's links from ``start``; every hop must prove continuity."""
    chain: list[Record] = []
    position = start
    while position is not None:
        record = view.record(position)
        if record is None or record.prev != prev or record.sequence != sequence:
            return Judgement(Verdict.NOT_RETAINED, "chain_broken", sequence, [])
        chain.append(record)
        prev = position
        position = view.next_in_sequence(position)
    if prev != view.sequences[sequence].high_water:
        return Judgement(Verdict.NOT_RETAINED, "chain_short", sequence, [])
    return Judgement(Verdict.RESUMED, "resumed", sequence, chain)


def evidence_for(
    session: str,
    raw_cursor: str,
    cursor: Cursor | None,
    view: SessionView,
    judgement: Judgement,
    *,
    torn_down: bool,
    replay: bool = True,
) -> Evidence:
    """Evidence with the same fields the Lua script reports.

    ``replayed`` counts the events actually returned: 0 for a probe
    (``replay=False``) that resumes, as in ``resolve.lua``.
    """
    seq = view.sequences.get(judgement.sequence) if judgement.sequence else None
    return Evidence(
        session=session,
        reason=judgement.reason,
        cursor=raw_cursor[:64],
        cursor_epoch=cursor.epoch if cursor else None,
        cursor_position=cursor.position if cursor else None,
        epoch=view.epoch,
        floor=view.floor,
        high_water=view.top,
        retained=view.retained,
        sequence=judgement.sequence,
        sequence_floor=seq.floor if seq else None,
        sequence_high_water=seq.high_water if seq else None,
        cursor_sequence=judgement.cursor_sequence,
        sequence_count=len(view.sequences),
        replayed=(len(judgement.chain) if replay else 0)
        if judgement.verdict is Verdict.RESUMED
        else None,
        torn_down=torn_down,
    )

"""The verdict rules, decided once, for every backend: the extension point for backends.

A backend gathers *facts* about one session as of one moment (the memory
backend under its lock, the Redis backend in one pipelined read that is as
good as a snapshot, or one Lua script) and :func:`judge` decides on them. Backends never decide a
verdict themselves, so the order of the checks exists in two places only: here
and in ``docs/verdicts.md``, which is the specification.

This module is public: a third-party :class:`~replaystore.Backend` implements
:class:`Facts` over its own store, calls :func:`judge` and builds the
evidence with :func:`evidence_for` (or :func:`unknown_session` when the
session does not exist), exactly as the built-in backends do, so it returns
the same verdict for the same state.

What a backend does after the decision (replay the events, or tear the session
down) must apply to the state the facts were read from: the Redis backend tears
down with a compare-and-delete on that state, and reads the facts again if the
session moved in between.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Protocol

from ._frozen import builder
from .cursor import MAX_CURSOR_LENGTH, Cursor, event_id_format, sequence_tag
from .info import SequenceInfo
from .verdicts import REASONS, Evidence, Replay, Tombstone, Verdict, reason_text

__all__ = [
    "EVIDENCE_CURSOR",
    "Chain",
    "Facts",
    "Judgement",
    "Record",
    "SequenceState",
    "Stored",
    "evidence_for",
    "judge",
    "unknown_session",
]


#: How much of a presented cursor the evidence repeats: a whole event id, and
#: no more of a garbage one (evidence goes into logs and HTTP bodies).
EVIDENCE_CURSOR = MAX_CURSOR_LENGTH


@dataclass(slots=True)
class Record:
    """One stored event: its position, its sequence and its ordinal within that sequence.

    Not frozen: a replay builds one per event, and frozen construction costs
    several times as much (``docs/benchmarks.md``); nothing mutates one after it is read.
    """

    position: int
    sequence: str
    ordinal: int
    payload: bytes | None
    stamp: int = 0  # when it was stored (ms): tells apart two events at one position


@dataclass(frozen=True, slots=True)
class SequenceState:
    """The bookkeeping of one sequence.

    Ordinals count the events of the sequence from 0; ``first_ordinal`` is the
    oldest one retained, ``next_ordinal`` the one the next event will get.
    """

    name: str
    tag: str
    high_water: int
    floor: int
    first_ordinal: int
    next_ordinal: int

    @property
    def retained(self) -> int:
        return self.next_ordinal - self.first_ordinal

    def info(self) -> SequenceInfo:
        return SequenceInfo(self.floor, self.high_water, self.retained)


@dataclass(frozen=True, slots=True)
class Stored:
    """Events of one sequence as stored, from one ordinal on, as two parallel lists.

    ``positions[i]`` is ``None`` where an event was lost. Arrays rather than one
    object per event: a replay reads many, and this is the hot path.
    """

    positions: list[int | None]
    payloads: list[bytes | None]
    #: When each was stored, as the backend keeps it (milliseconds, or their
    #: text): the rules pass stamps through to the events' ids untouched.
    stamps: list[int] | list[str]
    #: The positions as the backend read them, as text (with text stamps), or
    #: None: an id is then joined from text, not formatted from numbers again.
    texts: list[str] | None = None


@dataclass(frozen=True, slots=True)
class Chain:
    """The events a resume returns: ordinals ``first_ordinal`` onwards, in order."""

    sequence: str
    first_ordinal: int
    positions: list[int]
    payloads: list[bytes | None]
    stamps: list[int] | list[str]
    texts: list[str] | None = None  # as :attr:`Stored.texts`

    def __len__(self) -> int:
        return len(self.positions)

    def events(self, epoch: str) -> Replay:
        """The replayed events, with their ids: a replay's other hot loop.

        Returned as columns (:class:`~replaystore.verdicts.Replay`): an event
        tuple is built only for a caller that asks for one. From text
        positions and stamps, every id is spelled in one join of their
        pieces, then split apart (:func:`_ids`): a join per id, or a number
        turned into text per ordinal, would cost more than the rest.
        """
        positions = self.positions
        if not positions:
            return Replay([], self.sequence, [], [])
        name = self.sequence
        texts = self.texts
        ids: list[str]
        if texts is None:
            event_id = event_id_format(epoch, sequence_tag(name)).__mod__
            ordinals = range(self.first_ordinal, self.first_ordinal + len(positions))
            ids = list(map(event_id, zip(positions, ordinals, self.stamps, strict=True)))
        else:
            stamps: Any = self.stamps  # text, as the positions are
            ids = _ids(f"{epoch}-", f".{sequence_tag(name)}.", texts, self.first_ordinal, stamps)
        return Replay(ids, name, positions, self.payloads)


def _ids(head: str, middle: str, texts: list[str], first: int, stamps: list[str]) -> list[str]:
    """``head + text + middle + ordinal + "." + stamp`` for each event, ordinals from ``first``.

    One join of every piece, split at the line break that starts each next
    id (no piece holds one: an epoch, a tag and decimal texts). The ordinals
    come with their dot from :data:`_ORDINALS`: below 1000 as they are, above
    as their three last digits behind the rest, which all the ordinals of one
    thousand share (spelled once, into the middle piece); ordinals across
    thousands are spelled one by one.
    """
    count = len(texts)
    end = first + count
    ordinals: list[str]
    if end <= 1000:
        ordinals = _ORDINALS[first:end]
    elif first // 1000 == (end - 1) // 1000:
        thousands, first = divmod(first, 1000)
        middle = f"{middle}{thousands}"
        ordinals = _ORDINALS_3[first : first + count]
    else:
        ordinals = list(map("{}.".format, range(first, end)))
    pieces: list[str | None] = [None, middle, None, None, f"\n{head}"] * count
    pieces[0::5] = texts
    pieces[2::5] = ordinals
    pieces[3::5] = stamps
    pieces.pop()  # no id after the last
    return (head + "".join(pieces)).split("\n")  # type: ignore[arg-type]  # every piece set


#: ``"0."`` to ``"999."``, and the same on three digits (``"007."``): the ordinals of ids.
_ORDINALS = [f"{n}." for n in range(1000)]
_ORDINALS_3 = [f"{n:03d}." for n in range(1000)]


_EMPTY = Chain("", 0, [], [], [])


class Facts(Protocol):
    """What the rules read of one live session, all from one consistent snapshot."""

    @property
    def epoch(self) -> str: ...
    @property
    def top(self) -> int: ...
    @property
    def floor(self) -> int: ...
    @property
    def retained(self) -> int: ...
    @property
    def sequence_count(self) -> int: ...
    def sequence(self, name: str) -> SequenceState | None: ...
    def only_sequence(self) -> str | None:
        """The name of the session's one sequence (asked only when there is exactly one)."""
        ...

    def record(self, position: int) -> Record | None:
        """The stored event at ``position`` (asked only for floor <= position <= top)."""
        ...

    def events_from(self, sequence: str, ordinal: int) -> Stored:
        """The stored events of ``sequence`` from ``ordinal`` on (asked for a known sequence)."""
        ...

    def last_evicted(self, tag: str) -> Record | None:
        """The newest evicted event of the sequence with ``tag``, if the backend can show it.

        Asked only for a cursor below the floor. Its position and stamp are
        what proves that a cursor whose own event is gone missed nothing of
        its sequence: every event after it is still retained. ``None`` when
        the sequence is unknown, nothing of it was evicted, or the backend
        no longer holds that event's identity (the resume then fails closed).
        """
        ...


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    code: str
    sequence: str | None
    chain: Chain = _EMPTY
    cursor_sequence: str | None = None

    def __post_init__(self) -> None:
        # Every code belongs to exactly one verdict (checked, so no backend can drift).
        assert REASONS[self.code][0] is self.verdict, (self.verdict, self.code)

    @property
    def reason(self) -> str:
        return reason_text(self.code)


def judge(facts: Facts, cursor: Cursor | None, named: str | None) -> Judgement:
    """The verdict for ``cursor`` (and the events it resumes), checks 2-11 of ``docs/verdicts.md``.

    The caller has established check 1 (the session exists). The cursor's hint
    plays no part here: only its epoch and position decide.
    """

    def fail(verdict: Verdict, code: str, cursor_sequence: str | None = None) -> Judgement:
        return Judgement(verdict, code, named, _EMPTY, cursor_sequence)

    if cursor is None:
        return fail(Verdict.MALFORMED_CURSOR, "malformed")
    if cursor.epoch != facts.epoch:
        return fail(Verdict.FOREIGN_CURSOR, "foreign")
    if named is not None and facts.sequence(named) is None:
        return fail(Verdict.UNKNOWN_SEQUENCE, "unknown_sequence")
    p = cursor.position
    if p > facts.top:
        return fail(Verdict.AHEAD_OF_HIGH_WATER, "ahead")
    if p == 0:
        if facts.floor > 1:
            return fail(Verdict.BELOW_FLOOR, "origin_evicted")
        if named is None:
            if facts.sequence_count > 1:
                return fail(Verdict.AMBIGUOUS_SEQUENCE, "origin_ambiguous")
            if facts.sequence_count == 0:
                return Judgement(Verdict.RESUMED, "origin_empty", None)
            named = facts.only_sequence()
            if named is None:
                return fail(Verdict.NOT_RETAINED, "missing_event")
        state = facts.sequence(named)
        if state is None:
            return fail(Verdict.NOT_RETAINED, "no_sequence_state")
        return _chain(facts, state, state.first_ordinal, 0)
    if p < facts.floor:
        return _after_evicted(facts, cursor, named)
    record = facts.record(p)
    if record is None:
        return fail(Verdict.NOT_RETAINED, "missing_event")
    if cursor.stamp is not None and cursor.stamp != record.stamp:
        return fail(Verdict.NOT_RETAINED, "other_event")
    if named is not None and record.sequence != named:
        return fail(Verdict.SEQUENCE_MISMATCH, "mismatch", record.sequence)
    state = facts.sequence(record.sequence)
    if state is None:
        return Judgement(Verdict.NOT_RETAINED, "no_sequence_state", record.sequence)
    return _chain(facts, state, record.ordinal + 1, p)


def _after_evicted(facts: Facts, cursor: Cursor, named: str | None) -> Judgement:
    """Check 7: the cursor's own event was evicted. Did its sequence lose anything after it?

    Eviction takes the oldest positions first, so the events of a sequence
    that are gone are a prefix of it. When the cursor's event is the newest
    of them (same position, same stamp), nothing of that sequence after the
    cursor was evicted and the resume is exact: the sequence's retained
    events, or none when it has none left. Otherwise an event of the
    sequence after the cursor is gone (or nothing proves which sequence the
    cursor belongs to), and replaying would leave a silent gap.
    """
    tag = sequence_tag(named) if named is not None else cursor.tag
    gone = facts.last_evicted(tag) if tag else None
    if (
        gone is None
        or gone.position != cursor.position
        or (cursor.stamp is not None and cursor.stamp != gone.stamp)
        or (named is not None and gone.sequence != named)
    ):
        return Judgement(Verdict.BELOW_FLOOR, "evicted", named)
    state = facts.sequence(gone.sequence)
    if state is None or state.first_ordinal != gone.ordinal + 1:
        return Judgement(Verdict.BELOW_FLOOR, "evicted", named)
    return _chain(facts, state, state.first_ordinal, cursor.position)


def _chain(facts: Facts, state: SequenceState, start: int, after: int) -> Judgement:
    """The sequence's events from ordinal ``start``: all there, in order, up to its high-water."""
    want = state.next_ordinal - start
    stored = facts.events_from(state.name, start)
    positions = stored.positions[:want]
    last = after
    if positions:
        if None in positions:
            return Judgement(Verdict.NOT_RETAINED, "chain_broken", state.name)
        ordered: list[int] = positions  # type: ignore[assignment]  # no None: checked
        # strictly increasing (compared pairwise in C: this runs per replayed event)
        if ordered[0] <= after or not all(map(operator.lt, ordered, ordered[1:])):
            return Judgement(Verdict.NOT_RETAINED, "chain_broken", state.name)
        last = ordered[-1]
    if len(positions) != want or last != state.high_water:
        return Judgement(Verdict.NOT_RETAINED, "chain_short", state.name)
    chain = _new_chain(
        state.name,
        start,
        ordered if positions else [],
        stored.payloads[:want],
        stored.stamps[:want],
        None if stored.texts is None else stored.texts[:want],
    )
    return _new_judgement(Verdict.RESUMED, "resumed", state.name, chain, None)


def evidence_for(
    session: str,
    raw_cursor: str,
    cursor: Cursor | None,
    facts: Facts,
    judgement: Judgement,
    *,
    torn_down: bool,
    replay: bool,
) -> Evidence:
    """The evidence of a judgement, the same fields on every backend.

    ``replayed`` counts the events actually returned: 0 for a probe
    (``replay=False``) that resumes.
    """
    seq = facts.sequence(judgement.sequence) if judgement.sequence else None
    return _new_evidence(  # Evidence's fields, in order (one evidence per resume)
        session,  # session
        judgement.reason,  # reason
        raw_cursor[:EVIDENCE_CURSOR],  # cursor
        cursor.epoch if cursor else None,  # cursor_epoch
        cursor.position if cursor else None,  # cursor_position
        facts.epoch,  # epoch
        facts.floor,  # floor
        facts.top,  # high_water
        facts.retained,  # retained
        judgement.sequence,  # sequence
        seq.floor if seq else None,  # sequence_floor
        seq.high_water if seq else None,  # sequence_high_water
        judgement.cursor_sequence,  # cursor_sequence
        facts.sequence_count,  # sequence_count
        (len(judgement.chain) if replay else 0)  # replayed
        if judgement.verdict is Verdict.RESUMED
        else None,
        torn_down,  # torn_down
        None,  # tombstone
    )


# Positional constructors of the objects every resume builds (see ``_frozen``);
# tests/unit/test_frozen.py checks each against its class's own constructor.
_new_chain = builder(Chain)
_new_judgement = builder(Judgement)
_new_evidence = builder(Evidence)


def unknown_session(session: str, raw_cursor: str, tombstone: Tombstone | None) -> Evidence:
    """Evidence for check 1: the session does not exist (the tombstone says why, while it lasts)."""
    code = "no_session"
    if tombstone is not None:
        code = "closed" if tombstone.verdict is None else "torn_down"
    return Evidence(
        session=session,
        reason=reason_text(code),
        cursor=raw_cursor[:EVIDENCE_CURSOR],
        tombstone=tombstone,
    )

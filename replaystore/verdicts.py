"""What a resumption attempt can come to, and what the decision was based on.

The verdict is the one thing every replica must agree on, so it is a plain
string enum whose values are stable API: they travel in HTTP error bodies, logs
and metrics. Each verdict is reached for a short list of reasons; the reason
codes and their human text live here, next to the verdicts, so every backend
reports the same words. The rules that pick a verdict, and their order, are
written down in ``docs/verdicts.md`` and implemented once, in
``replaystore/rules.py``, for every backend.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat
from typing import Any, NamedTuple, overload

from .cursor import Cursor
from .errors import ReplayStoreError

__all__ = [
    "REASONS",
    "Event",
    "Evidence",
    "Resumption",
    "ResumptionDesyncError",
    "Tombstone",
    "Verdict",
    "reason_text",
]


class Verdict(enum.StrEnum):
    """The outcome of resolving a cursor. Only :attr:`RESUMED` is a success."""

    RESUMED = "resumed"
    MALFORMED_CURSOR = "malformed_cursor"
    UNKNOWN_SESSION = "unknown_session"
    FOREIGN_CURSOR = "foreign_cursor"
    BELOW_FLOOR = "below_floor"
    AHEAD_OF_HIGH_WATER = "ahead_of_high_water"
    AMBIGUOUS_SEQUENCE = "ambiguous_sequence"
    UNKNOWN_SEQUENCE = "unknown_sequence"
    SEQUENCE_MISMATCH = "sequence_mismatch"
    NOT_RETAINED = "not_retained"
    STORE_REGRESSED = "store_regressed"

    @property
    def ok(self) -> bool:
        return self is Verdict.RESUMED

    def __str__(self) -> str:
        return self.value


#: Every reason code, the one verdict it explains, and its text (what goes into
#: logs, tombstones and HTTP error bodies).
REASONS: dict[str, tuple[Verdict, str]] = {
    "resumed": (Verdict.RESUMED, "continuity proven from the cursor to the sequence high-water"),
    "origin_empty": (Verdict.RESUMED, "nothing has been issued yet"),
    "no_session": (Verdict.UNKNOWN_SESSION, "the session does not exist"),
    "invalid_session": (Verdict.UNKNOWN_SESSION, "not a valid session id"),
    "closed": (Verdict.UNKNOWN_SESSION, "the session was closed"),
    "torn_down": (Verdict.UNKNOWN_SESSION, "the session was torn down after a failed resumption"),
    "index_lost": (
        Verdict.UNKNOWN_SESSION,
        "the session was torn down: the store lost the index its retention is kept by",
    ),
    "malformed": (
        Verdict.MALFORMED_CURSOR,
        "the cursor is not of the form <epoch>-<position>[.<tag>.<ordinal>.<stamp>]",
    ),
    "foreign": (
        Verdict.FOREIGN_CURSOR,
        "the cursor was issued by another session or an earlier incarnation of this one",
    ),
    "unknown_sequence": (
        Verdict.UNKNOWN_SEQUENCE,
        "the session has no retained sequence of that name",
    ),
    "ahead": (
        Verdict.AHEAD_OF_HIGH_WATER,
        "the cursor is ahead of the last issued position (stale replica or reordering proxy)",
    ),
    "origin_evicted": (Verdict.BELOW_FLOOR, "events since the origin have been evicted"),
    "origin_ambiguous": (
        Verdict.AMBIGUOUS_SEQUENCE,
        "the origin cursor names no sequence and the session has several",
    ),
    "evicted": (
        Verdict.BELOW_FLOOR,
        "an event of the cursor's sequence after it has been evicted (never clamp to the floor)",
    ),
    "missing_event": (Verdict.NOT_RETAINED, "no event is retained at the cursor position"),
    "other_event": (
        Verdict.NOT_RETAINED,
        "the event stored at the cursor's position is not the cursor's (lost in a failover?)",
    ),
    "mismatch": (
        Verdict.SEQUENCE_MISMATCH,
        "the cursor's event belongs to another sequence than the one named",
    ),
    "no_sequence_state": (Verdict.NOT_RETAINED, "the cursor's sequence has no bookkeeping"),
    "chain_broken": (
        Verdict.NOT_RETAINED,
        "the sequence's events after the cursor are not all retained, in order",
    ),
    "chain_short": (
        Verdict.NOT_RETAINED,
        "the sequence's retained events do not reach its high-water",
    ),
    "store_regressed": (
        Verdict.STORE_REGRESSED,
        "the store no longer holds events it had acknowledged (a failover to a replica "
        "that had not received them); the session was ended rather than resumed with a gap",
    ),
    "store_restored": (
        Verdict.STORE_REGRESSED,
        "the store went back in time since the session began (restored from an older "
        "snapshot, or failed over to a replica that had not received every write); the "
        "session was ended rather than served from a history that may have been rewritten",
    ),
    # Reached by replaystore.mcp, outside the store's judgement:
    "attached_live": (Verdict.RESUMED, "attached live"),  # a plain GET with nothing to replay
    "vanished": (
        Verdict.UNKNOWN_SESSION,
        # gone under a live SDK session, with no tombstone to say why
        "the replay store no longer has the session this server was serving "
        "(it expired, or the store restarted empty or failed over)",
    ),
}


def reason_text(code: str) -> str:
    """The human text of a reason code (the code itself if it is unknown)."""
    entry = REASONS.get(code)
    return code if entry is None else entry[1]


class Event(NamedTuple):
    """One stored event. ``payload`` is ``None`` for a priming event.

    A named tuple rather than a dataclass: a replay builds one per event, and
    a tuple is much cheaper to build than a frozen dataclass (``docs/benchmarks.md``).
    """

    event_id: str
    sequence: str
    position: int
    payload: bytes | None

    @property
    def cursor(self) -> Cursor:
        return Cursor.parse(self.event_id)


class Replay(Sequence[Event]):
    """A replay's events, kept as the columns they were read in: ids, positions, payloads.

    What a resume returns as :attr:`Resumption.events`: a sequence of
    :class:`Event` (index it, slice it, iterate it, compare it with a list),
    whose events are built only when one is asked for. A replay costs about
    what its steps per event cost, and one tuple per event is a step a
    server that writes the replay out does not need: it reads :attr:`ids`
    and :attr:`payloads` instead, and builds no event. Not to be changed in
    place (the columns are shared with its slices' sources).
    """

    __slots__ = ("_built", "ids", "payloads", "positions", "sequence")

    def __init__(
        self,
        ids: list[str],
        sequence: str,
        positions: list[int],
        payloads: list[bytes | None],
    ) -> None:
        self.ids = ids
        self.sequence = sequence
        self.positions = positions
        self.payloads = payloads
        self._built: list[Event] | None = None

    def _events(self) -> list[Event]:
        built = self._built
        if built is None:
            # ``tuple.__new__`` over the rows: no Python code run per event.
            rows = zip(self.ids, repeat(self.sequence), self.positions, self.payloads)
            built = self._built = list(map(_new_tuple, repeat(Event), rows))
        return built

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> Replay: ...
    def __getitem__(self, index: int | slice) -> Event | Replay:
        if isinstance(index, slice):
            return Replay(
                self.ids[index], self.sequence, self.positions[index], self.payloads[index]
            )
        return self._events()[index]

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Replay):
            return self._events() == other._events()
        if isinstance(other, list):
            return self._events() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, so unhashable as one

    def __repr__(self) -> str:
        return repr(self._events())


_new_tuple = tuple.__new__


@dataclass(frozen=True, slots=True)
class Tombstone:
    """Why a session stopped existing, kept for a while after it did.

    ``verdict`` is the failed verdict that tore the session down, or ``None``
    when it was closed on purpose (``reason`` then says ``"closed"``).
    """

    reason: str
    at: float
    verdict: Verdict | None = None


@dataclass(frozen=True, slots=True)
class Evidence:
    """The facts a verdict was decided on, as read in the same atomic step.

    Every field but ``session`` and ``reason`` is optional: a verdict reached
    early (say, an unknown session) has seen less. ``as_dict`` drops the
    missing ones, which is the form put in HTTP error bodies and logs.
    """

    session: str
    reason: str
    cursor: str | None = None
    cursor_epoch: str | None = None
    cursor_position: int | None = None
    epoch: str | None = None
    floor: int | None = None
    high_water: int | None = None
    retained: int | None = None
    sequence: str | None = None
    sequence_floor: int | None = None
    sequence_high_water: int | None = None
    cursor_sequence: str | None = None
    sequence_count: int | None = None
    replayed: int | None = None
    torn_down: bool = False
    tombstone: Tombstone | None = None

    def as_dict(self) -> dict[str, Any]:
        # Field by field rather than through ``dataclasses.asdict``, whose deep
        # copy asks every plain value whether it is a dataclass (an exception
        # formatted and dropped per field): a failed resume builds this once.
        out: dict[str, Any] = {}
        for key in _EVIDENCE_FIELDS:
            value = getattr(self, key)
            if value is None or (key == "torn_down" and not value):
                continue
            if key == "tombstone":
                verdict = value.verdict
                stone = {
                    "reason": value.reason,
                    "at": value.at,
                    "verdict": verdict and str(verdict),
                }
                value = {k: v for k, v in stone.items() if v is not None}
            out[key] = value
        return out


_EVIDENCE_FIELDS = tuple(f.name for f in fields(Evidence))


@dataclass(frozen=True, slots=True)
class Resumption:
    """The answer to one resolve (and replay) call.

    ``events`` holds exactly the events after the cursor in ``sequence``, in
    position order, when the verdict is :attr:`Verdict.RESUMED` and the call
    replayed; it is empty otherwise. There is never a partial replay. The
    built-in backends return it as a :class:`Replay` (a sequence of events
    read in columns); it compares equal to the list of the same events.
    """

    verdict: Verdict
    evidence: Evidence
    sequence: str | None = None
    events: Sequence[Event] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.RESUMED

    def raise_for_verdict(self) -> Resumption:
        """Return self when resumed, raise :class:`ResumptionDesyncError` otherwise."""
        if not self.ok:
            raise ResumptionDesyncError(self)
        return self


class ResumptionDesyncError(ReplayStoreError, RuntimeError):
    """A ``Last-Event-ID`` could not be proven continuous with the retained log.

    Carries the :class:`Resumption` so the verdict and its evidence travel
    with it (:meth:`Resumption.raise_for_verdict` raises it). Defined beside
    the verdicts rather than in ``errors.py``: it is built from one, and
    ``errors.py`` stays a module that imports nothing of the package.
    """

    def __init__(self, resumption: Resumption) -> None:
        evidence = resumption.evidence
        super().__init__(f"{resumption.verdict.value}: {evidence.reason}")
        self.resumption = resumption

    @property
    def verdict(self) -> Verdict:
        return self.resumption.verdict

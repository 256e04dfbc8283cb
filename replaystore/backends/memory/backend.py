"""``memory://``: the embedded backend, one process, no dependencies.

Every operation is one uninterrupted stretch of synchronous code (no ``await``
inside), so under asyncio or trio no other task can run between reading the
facts, judging them and replaying: that is what makes append and
resolve-and-replay atomic here. A ``threading.Lock`` additionally guards
against callers on other threads.

The layout mirrors the Redis backend on purpose (``docs/data-layout.md``): one
list of events per sequence, addressed by ordinal; a list of *runs* (stretches
of consecutive positions of one sequence) that maps a position to its sequence
and orders eviction; the same retention arithmetic. The verdict itself comes
from ``replaystore/rules.py``, as on Redis, so both give the same answer, the
same evidence and the same event ids.
"""

from __future__ import annotations

import bisect
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ...cursor import Cursor, event_id, new_epoch, sequence_tag
from ...errors import (
    IdempotencyKeyReusedError,
    SequenceTagCollisionError,
    UnknownSessionError,
    UnsupportedURLError,
)
from ...info import SessionInfo
from ...retention import EVICTED_SEQUENCES, IDEMPOTENCY_KEYS, Retention, run_split_ms
from ...rules import Record, SequenceState, Stored, evidence_for, judge, unknown_session
from ...verdicts import Resumption, Tombstone, Verdict, reason_text
from .. import register_backend
from ..base import Backend
from .coordination import InProcess

__all__ = ["MemoryBackend"]

# How often (in operations) expired sessions and tombstones are swept away.
_SWEEP_EVERY = 1024


@dataclass(slots=True)
class _Seq:
    """One sequence: its events by ordinal (``events[0]`` has ordinal ``first``)."""

    name: str
    tag: str
    high_water: int
    floor: int
    first: int = 0
    next: int = 0
    priming: bool = False  # the newest event is a priming event
    events: list[Record | None] = field(default_factory=list)
    #: The newest evicted event (ordinal ``first - 1``): what proves a cursor
    #: at it continuous although its event is gone (``rules.last_evicted``).
    evicted: Record | None = None

    def state(self) -> SequenceState:
        return SequenceState(
            self.name, self.tag, self.high_water, self.floor, self.first, self.next
        )


@dataclass(slots=True)
class _Run:
    """Consecutive positions of one sequence, starting at ``position`` with ``ordinal``."""

    position: int
    tag: str
    ordinal: int
    at_ms: int


@dataclass(slots=True)
class _Session:
    epoch: str
    touched: float
    top: int = 0
    floor: int = 1  # one past the last evicted position
    retained: int = 0
    seqs: dict[str, _Seq] = field(default_factory=dict)  # by tag, emptied ones included
    nseq: int = 0  # sequences with retained events
    emptied: dict[str, None] = field(default_factory=dict)  # tags of emptied ones, oldest first
    runs: list[_Run] = field(default_factory=list)
    keys: dict[str, list[str]] = field(default_factory=dict)  # idempotency: this generation
    old_keys: dict[str, list[str]] = field(default_factory=dict)  # and the previous one

    # -- Facts (replaystore.rules) ----------------------------------------

    @property
    def sequence_count(self) -> int:
        return self.nseq

    def sequence(self, name: str) -> SequenceState | None:
        seq = self.seqs.get(sequence_tag(name))
        return seq.state() if seq is not None and seq.name == name else None

    def only_sequence(self) -> str | None:
        if self.nseq != 1:
            return None
        return next(s.name for s in self.seqs.values() if s.first < s.next)

    def record(self, position: int) -> Record | None:
        index = bisect.bisect_right(self.runs, position, key=lambda r: r.position) - 1
        if index < 0:
            return None
        run = self.runs[index]
        seq = self.seqs.get(run.tag)
        if seq is None:
            return None
        ordinal = run.ordinal + position - run.position
        got = self._at(seq, ordinal)
        return got if got is not None and got.position == position else None

    def events_from(self, sequence: str, ordinal: int) -> Stored:
        seq = self.seqs.get(sequence_tag(sequence))
        events = seq.events[max(0, ordinal - seq.first) :] if seq is not None else []
        return Stored(
            [None if r is None else r.position for r in events],
            [None if r is None else r.payload for r in events],
            [0 if r is None else r.stamp for r in events],
        )

    def last_evicted(self, tag: str) -> Record | None:
        seq = self.seqs.get(tag)
        return seq.evicted if seq is not None else None

    @staticmethod
    def _at(seq: _Seq, ordinal: int) -> Record | None:
        index = ordinal - seq.first
        return seq.events[index] if 0 <= index < len(seq.events) else None

    # -- retention -----------------------------------------------------------

    def trim(self, retention: Retention, now_ms: int) -> None:
        """Evict the oldest events while over ``max_events`` or older than ``max_age``.

        Eviction walks the runs from the oldest; an event's age is its run's
        (runs are split often enough for that to be close: ``run_split_ms``).
        """
        max_age_ms = retention.max_age_ms
        while self.runs and self.retained > 0:
            run = self.runs[0]
            end = self.runs[1].position if len(self.runs) > 1 else self.top + 1
            avail = end - self.floor
            if avail <= 0:
                del self.runs[0]
                continue
            over = self.retained - retention.max_events
            k = min(over, avail) if over > 0 else 0
            if max_age_ms and run.at_ms <= now_ms - max_age_ms:
                k = avail
            if k <= 0:
                break
            seq = self.seqs.get(run.tag)
            self.floor += k
            self.retained -= k
            if seq is not None:
                seq.evicted = seq.events[k - 1] if k <= len(seq.events) else None
                del seq.events[:k]
                seq.first += k
                if seq.first >= seq.next:
                    self._emptied(seq)
                elif self.floor < end:
                    seq.floor = self.floor
                else:
                    seq.floor = self._next_run_position(run.tag, seq.floor)
            if self.floor >= end:
                del self.runs[0]

    def _emptied(self, seq: _Seq) -> None:
        """Every event of ``seq`` is evicted: keep its state (up to a bound), not its events."""
        seq.floor = seq.high_water + 1
        self.nseq -= 1
        self.emptied[seq.tag] = None
        if len(self.emptied) > EVICTED_SEQUENCES:
            oldest = next(iter(self.emptied))
            del self.emptied[oldest], self.seqs[oldest]

    def revive(self, seq: _Seq, position: int) -> None:
        """An emptied sequence gets an event again: it goes on where it stopped."""
        del self.emptied[seq.tag]
        seq.floor = position
        self.nseq += 1

    def _next_run_position(self, tag: str, old: int) -> int:
        for run in self.runs[1:]:
            if run.tag == tag:
                return run.position
        return old


class _Store:
    """The sessions of one in-process store, possibly shared by several backends."""

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self.tombstones: dict[str, tuple[float, Tombstone]] = {}  # session -> (expires, why)
        self.lock = threading.Lock()


# Named stores (``memory://NAME``) live while some backend uses them.
_NAMED: weakref.WeakValueDictionary[str, _Store] = weakref.WeakValueDictionary()


@register_backend
class MemoryBackend(Backend):
    """In-process session logs. Data lives and dies with the process.

    ``memory://`` is private to one buffer; ``memory://NAME`` is shared by every
    buffer in the process that names it, which is how two "replicas" in one
    process (or a test) share one verdict source.
    """

    schemes = ("memory",)

    def __init__(
        self,
        retention: Retention,
        *,
        name: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(retention)
        self._clock = clock
        if name is None:
            self._store = _Store()
        else:
            self._store = _NAMED.get(name) or _NAMED.setdefault(name, _Store())
        self._sessions = self._store.sessions
        self._tombstones = self._store.tombstones
        self._lock = self._store.lock
        self._ops = 0

    @classmethod
    def from_url(cls, url: str, retention: Retention, **options: Any) -> MemoryBackend:
        parts = urlsplit(url)
        if parts.path.strip("/") or parts.query or parts.fragment:
            raise UnsupportedURLError(f"memory:// takes at most a store name: {url!r}")
        # Checked here, not left to the constructor's TypeError: a Redis option
        # (socket_timeout=...) with a memory:// URL is a configuration mistake
        # to name, not a crash.
        unknown = sorted(set(options) - {"name", "clock"})
        if unknown:
            raise UnsupportedURLError(
                f"unknown option(s) for a memory:// store: {', '.join(unknown)}"
            )
        if parts.netloc:
            options.setdefault("name", parts.netloc)
        return cls(retention, **options)

    def coordination(self) -> InProcess:
        """Replicas sharing this store all run in this process: they call each other directly."""
        return InProcess(self._store)

    # -- bookkeeping -------------------------------------------------------

    def _live(self, session: str, now: float) -> _Session | None:
        """The session if it exists and has not outlived its TTL, trimmed by age."""
        self._ops += 1
        if self._ops % _SWEEP_EVERY == 0:
            self._sweep(now)
        state = self._sessions.get(session)
        if state is None:
            return None
        if now - state.touched >= self.retention.session_ttl:
            del self._sessions[session]
            return None
        if self.retention.max_age is not None:
            state.trim(self.retention, _ms(now))
        return state

    def _sweep(self, now: float) -> None:
        ttl = self.retention.session_ttl
        for name in [n for n, s in self._sessions.items() if now - s.touched >= ttl]:
            del self._sessions[name]
        for name in [n for n, (exp, _) in self._tombstones.items() if exp <= now]:
            del self._tombstones[name]

    def _tombstone(self, session: str, now: float) -> Tombstone | None:
        entry = self._tombstones.get(session)
        if entry is None or entry[0] <= now:
            return None
        return entry[1]

    def _bury(self, session: str, tomb: Tombstone, ttl: float | None = None) -> None:
        self._sessions.pop(session, None)
        kept = self.retention.tombstone_ttl if ttl is None else ttl
        self._tombstones[session] = (tomb.at + kept, tomb)

    # -- the contract ------------------------------------------------------

    async def open_session(self, session: str) -> SessionInfo:
        with self._lock:
            now = self._clock()
            state = self._live(session, now)
            if state is None:
                state = self._sessions[session] = _Session(epoch=new_epoch(), touched=now)
                self._tombstones.pop(session, None)
            state.touched = now
            return _info(session, state)

    async def append(
        self,
        session: str,
        sequence: str,
        payloads: Sequence[bytes | None],
        *,
        idempotency_key: str | None = None,
    ) -> list[str]:
        with self._lock:
            now = self._clock()
            state = self._live(session, now)
            if state is None:
                raise UnknownSessionError(session)
            if idempotency_key is not None:
                done = state.keys.get(idempotency_key) or state.old_keys.get(idempotency_key)
                if done is not None:
                    if len(done) != len(payloads):
                        raise IdempotencyKeyReusedError(idempotency_key)
                    state.touched = now
                    return list(done)
            ids = self._store_events(state, sequence, payloads, _ms(now))
            if idempotency_key is not None:
                if len(state.keys) >= IDEMPOTENCY_KEYS:
                    state.old_keys, state.keys = state.keys, {}
                state.keys[idempotency_key] = ids
            state.touched = now
            return ids

    def _store_events(
        self, state: _Session, sequence: str, payloads: Sequence[bytes | None], now_ms: int
    ) -> list[str]:
        tag = sequence_tag(sequence)
        split_ms = run_split_ms(self.retention)
        ids: list[str] = []
        for payload in payloads:
            seq = state.seqs.get(tag)
            if seq is not None and seq.name != sequence:
                raise SequenceTagCollisionError(sequence)
            if seq is not None and payload is None and seq.priming and seq.events:
                # Only the newest of consecutive priming events is kept: the
                # client already holds its id, and nothing real came after it.
                newest = seq.events[-1] if seq.events else None
                stamp = newest.stamp if newest is not None else 0
                ids.append(event_id(state.epoch, seq.high_water, tag, seq.next - 1, stamp))
                continue
            state.top += 1
            position = state.top
            if seq is None:
                seq = state.seqs[tag] = _Seq(sequence, tag, position, position)
                state.nseq += 1
            elif seq.first == seq.next:
                state.revive(seq, position)
            last = state.runs[-1] if state.runs else None
            if (
                last is None
                or last.tag != tag
                or last.ordinal + (position - last.position) != seq.next
                or (split_ms and now_ms - last.at_ms >= split_ms)
            ):
                state.runs.append(_Run(position, tag, seq.next, now_ms))
            seq.events.append(Record(position, sequence, seq.next, payload, now_ms))
            ids.append(event_id(state.epoch, position, tag, seq.next, now_ms))
            seq.next += 1
            seq.high_water = position
            seq.priming = payload is None
            state.retained += 1
        state.trim(self.retention, now_ms)
        return ids

    async def resolve(
        self,
        session: str,
        cursor: Cursor | None,
        raw_cursor: str,
        sequence: str | None,
        *,
        replay: bool,
        teardown: bool,
    ) -> Resumption:
        with self._lock:
            now = self._clock()
            state = self._live(session, now)
            if state is None:
                evidence = unknown_session(session, raw_cursor, self._tombstone(session, now))
                return Resumption(Verdict.UNKNOWN_SESSION, evidence, sequence)
            judgement = judge(state, cursor, sequence)
            failed = judgement.verdict is not Verdict.RESUMED
            torn_down = failed and replay and teardown
            evidence = evidence_for(
                session, raw_cursor, cursor, state, judgement, torn_down=torn_down, replay=replay
            )
            if torn_down:
                self._bury(session, Tombstone(judgement.reason, now, judgement.verdict))
            elif replay:
                state.touched = now
            events = judgement.chain.events(state.epoch) if replay and not failed else []
            return Resumption(judgement.verdict, evidence, judgement.sequence, events)

    async def session_info(self, session: str) -> SessionInfo | None:
        with self._lock:
            state = self._live(session, self._clock())
            return None if state is None else _info(session, state)

    async def close_session(self, session: str, *, tombstone_ttl: float | None = None) -> bool:
        with self._lock:
            now = self._clock()
            existed = self._live(session, now) is not None
            if existed:
                self._bury(session, Tombstone(reason_text("closed"), now), tombstone_ttl)
            return existed


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _info(session: str, state: _Session) -> SessionInfo:
    ordered = sorted(state.seqs.values(), key=lambda s: s.floor)
    return SessionInfo(
        session=session,
        epoch=state.epoch,
        floor=state.floor,
        high_water=state.top,
        retained=state.retained,
        sequences={s.name: s.state().info() for s in ordered},
    )

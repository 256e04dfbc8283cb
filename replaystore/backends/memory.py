"""``memory://``: the embedded backend, one process, no dependencies.

Every operation is one uninterrupted stretch of synchronous code (no ``await``
inside), so under asyncio or trio no other task can run between the checks and
the replay: that is what makes append and resolve-and-replay atomic here. A
``threading.Lock`` additionally guards against callers on other threads.

The layout mirrors the Redis backend on purpose (records keyed by position, a
link from each record to the next one of its sequence, per-sequence floor and
high-water), so that the same rules in ``replaystore/_rules.py`` apply.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .._rules import Record, SequenceState, evidence_for, judge
from .._rules import reason as _reason
from ..cursor import Cursor, new_epoch
from ..errors import UnknownSessionError, UnsupportedURLError
from ..info import SequenceInfo, SessionInfo
from ..retention import Retention
from ..verdicts import Event, Evidence, Resumption, Tombstone, Verdict
from . import register_backend
from .base import Backend

__all__ = ["MemoryBackend"]

# How often (in operations) expired sessions and tombstones are swept away.
_SWEEP_EVERY = 1024


@dataclass(slots=True)
class _Session:
    epoch: str
    touched: float
    top: int = 0
    floor: int = 1  # one past the last evicted position
    retained: int = 0  # bookkept, like the Redis meta hash: damage does not change it
    records: dict[int, Record] = field(default_factory=dict)  # insertion order = position order
    links: dict[int, int] = field(default_factory=dict)  # position -> next position, same sequence
    sequences: dict[str, SequenceState] = field(default_factory=dict)

    def record(self, position: int) -> Record | None:
        return self.records.get(position)

    def next_in_sequence(self, position: int) -> int | None:
        return self.links.get(position)

    def evict_oldest(self) -> None:
        position, record = next(iter(self.records.items()))
        del self.records[position]
        self.floor = position + 1
        self.retained -= 1
        following = self.links.pop(position, None)
        state = self.sequences[record.sequence]
        state.retained -= 1
        if state.retained == 0:
            del self.sequences[record.sequence]
        elif following is not None:
            state.floor = following


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
        if parts.netloc:
            options.setdefault("name", parts.netloc)
        return cls(retention, **options)

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
        max_age = self.retention.max_age
        if max_age is not None:
            while state.records and now - next(iter(state.records.values())).at >= max_age:
                state.evict_oldest()
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

    def _bury(self, session: str, tomb: Tombstone) -> None:
        self._sessions.pop(session, None)
        self._tombstones[session] = (tomb.at + self.retention.tombstone_ttl, tomb)

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
        self, session: str, sequence: str, payloads: Sequence[bytes | None]
    ) -> tuple[str, int]:
        with self._lock:
            now = self._clock()
            state = self._live(session, now)
            if state is None:
                raise UnknownSessionError(session)
            first = state.top + 1
            seq = state.sequences.get(sequence)
            for payload in payloads:
                state.top += 1
                position = state.top
                if seq is None:
                    seq = state.sequences[sequence] = SequenceState(position, position, 0)
                    prev = 0
                else:
                    prev = seq.high_water
                    state.links[prev] = position
                    seq.high_water = position
                seq.retained += 1
                state.retained += 1
                state.records[position] = Record(position, sequence, prev, now, payload)
                if state.retained > self.retention.max_events and state.records:
                    state.evict_oldest()
                    seq = state.sequences.get(sequence)
            state.touched = now
            return state.epoch, first

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
                tomb = self._tombstone(session, now)
                code = "no_session"
                if tomb is not None:
                    code = "closed" if tomb.verdict is None else "torn_down"
                reason = _reason(code)
                evidence = Evidence(
                    session=session, reason=reason, cursor=raw_cursor[:64], tombstone=tomb
                )
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
            events = (
                [
                    Event(f"{state.epoch}-{r.position}", r.sequence, r.position, r.payload)
                    for r in judgement.chain
                ]
                if replay and not failed
                else []
            )
            return Resumption(judgement.verdict, evidence, judgement.sequence, events)

    async def session_info(self, session: str) -> SessionInfo | None:
        with self._lock:
            state = self._live(session, self._clock())
            return None if state is None else _info(session, state)

    async def close_session(self, session: str) -> bool:
        with self._lock:
            now = self._clock()
            existed = self._live(session, now) is not None
            if existed:
                self._bury(session, Tombstone(_reason("closed"), now))
            return existed


def _info(session: str, state: _Session) -> SessionInfo:
    return SessionInfo(
        session=session,
        epoch=state.epoch,
        floor=state.floor,
        high_water=state.top,
        retained=state.retained,
        sequences={
            name: SequenceInfo(s.floor, s.high_water, s.retained)
            for name, s in state.sequences.items()
        },
    )

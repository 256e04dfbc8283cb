"""The session registry of a ``memory://`` store: every replica runs in this process.

Every buffer of the process naming the store (``memory://NAME``) shares one
registry, kept per store object, so replicas that share the events share
the records and leases too. Each operation runs with no ``await`` inside:
as atomic as the Redis commands it mirrors.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable

from ...cursor import Cursor
from ..session_registry import FINISHED, FINISHED_TTL, Registry, holder_field, holders

__all__ = ["MemoryRegistry"]


class _MemoryState:
    def __init__(self) -> None:
        self.records: dict[str, tuple[dict[str, str], float]] = {}
        self.leases: dict[tuple[str, str], tuple[str, float]] = {}
        self.ends: dict[tuple[str, str], float] = {}
        self.writes = 0

    def sweep(self) -> None:
        """Forget what expired (every so many writes, so memory does not grow forever)."""
        self.writes += 1
        if self.writes % 1000:
            return
        now = _now()
        for key in [k for k, (_, until) in self.records.items() if until <= now]:
            del self.records[key]
        for lease in [k for k, (_, until) in self.leases.items() if until <= now]:
            del self.leases[lease]
        for end in [k for k, until in self.ends.items() if until <= now]:
            del self.ends[end]


_MEMORY: weakref.WeakKeyDictionary[object, _MemoryState] = weakref.WeakKeyDictionary()


def _now() -> float:
    return time.monotonic()


class MemoryRegistry(Registry):
    """The registry of a memory store, shared by every buffer using that store."""

    def __init__(self, key: object) -> None:
        state = _MEMORY.get(key)
        if state is None:
            state = _MEMORY[key] = _MemoryState()
        self._state = state

    async def put_session(self, session: str, fields: dict[str, str], ttl: float | None) -> None:
        self._state.sweep()
        self._state.records[session] = (dict(fields), _deadline(ttl))

    async def get_session(self, session: str) -> dict[str, str] | None:
        entry = self._state.records.get(session)
        if entry is None:
            return None
        if entry[1] <= _now():
            del self._state.records[session]
            return None
        return dict(entry[0])

    async def update_session(self, session: str, fields: dict[str, str]) -> None:
        if await self.get_session(session) is not None:
            self._state.records[session][0].update(fields)

    async def raise_mark(self, session: str, name: str, mark: str) -> None:
        if await self.get_session(session) is None:
            return
        fields = self._state.records[session][0]
        if _position(fields.get(name)) < _position(mark):
            fields[name] = mark

    async def touch_session(self, session: str, ttl: float) -> None:
        record = await self.get_session(session)
        if record is not None:
            self._state.records[session] = (self._state.records[session][0], _deadline(ttl))

    async def drop_session(self, session: str) -> None:
        self._state.records.pop(session, None)

    async def hold(self, session: str, replica: str) -> dict[str, str] | None:
        if await self.get_session(session) is None:
            return None
        fields = self._state.records[session][0]
        fields[holder_field(replica)] = "1"
        return dict(fields)

    async def end_session(self, session: str) -> frozenset[str] | None:
        record = await self.get_session(session)
        self._state.records.pop(session, None)
        return (holders(record) or None) if record is not None else None

    async def acquire(self, session: str, stream: str, owner: str, ttl: float) -> bool:
        self._state.sweep()
        if await self.owner(session, stream) is not None:
            return False
        self._state.leases[(session, stream)] = (owner, _deadline(ttl))
        return True

    async def renew(self, leases: Iterable[tuple[str, str]], owner: str, ttl: float) -> list[bool]:
        kept = []
        for key in leases:
            held = await self.owner(*key) == owner
            if held:
                self._state.leases[key] = (owner, _deadline(ttl))
            kept.append(held)
        return kept

    async def release(self, session: str, stream: str, owner: str) -> None:
        if await self.owner(session, stream) == owner:
            self._state.leases[(session, stream)] = (FINISHED, _deadline(FINISHED_TTL))

    async def abandon(self, session: str, stream: str, owner: str) -> None:
        if await self.owner(session, stream) == owner:
            del self._state.leases[(session, stream)]

    async def owner(self, session: str, stream: str) -> str | None:
        entry = self._state.leases.get((session, stream))
        if entry is None:
            return None
        if entry[1] <= _now():
            del self._state.leases[(session, stream)]
            return None
        return entry[0]

    async def claim_end(self, session: str, stream: str, ttl: float) -> bool:
        key = (session, stream)
        until = self._state.ends.get(key)
        if until is not None and until > _now():
            return False
        self._state.ends[key] = _deadline(ttl)
        return True


def _deadline(ttl: float | None) -> float:
    return float("inf") if ttl is None else _now() + ttl


def _position(mark: str | None) -> int:
    """The position of an event id (-1 for none, or for anything that is not one)."""
    cursor = Cursor.try_parse(mark)
    return -1 if cursor is None else cursor.position

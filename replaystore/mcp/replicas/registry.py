"""The session registry: what any replica needs to serve a session, and request leases.

Kept next to the session's events, in the same store:

- **the session record**, written when ``initialize`` is answered: the
  negotiated protocol version and the client's ``initialize`` parameters (so
  another replica can rebuild the SDK's connection in its initialized
  state), the credential that created it, and the standalone GET stream's
  mark. A replica adopts a session only if its record exists: nothing is
  conjured from a client-chosen id.
- **leases**: the replica running a request holds a lease on its stream,
  renewed while it runs. A lease that lapses (replica killed, partition) lets
  another replica end the stream with an error response, once: the *end
  claim* is a set-if-absent marker.

On Redis every key of a session carries the session's hash tag, so on a
cluster they live in the slot of the session's events. On ``memory://NAME``
every buffer of the process naming the store shares one registry.
"""

from __future__ import annotations

import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from ...backends.coordination import Coordination, OnRedis
from ...errors import StorageError

__all__ = ["FINISHED", "MemoryRegistry", "RedisRegistry", "Registry", "registry_for"]

#: The lease holder of a request whose response is stored: no replica runs it
#: any more, and it must not be ended as lost. Replica ids never look like this.
FINISHED = "-"

#: Seconds a finished request is remembered as such.
_FINISHED_TTL = 3600.0


class Registry(ABC):
    """Session records, leases and end claims of one store."""

    @abstractmethod
    async def put_session(self, session: str, fields: dict[str, str], ttl: float | None) -> None:
        """Create or replace the record of ``session`` (expiring after ``ttl`` seconds)."""

    @abstractmethod
    async def get_session(self, session: str) -> dict[str, str] | None:
        """The record, or None if the store does not know the session (or it ended)."""

    @abstractmethod
    async def update_session(self, session: str, fields: dict[str, str]) -> None:
        """Change fields of an existing record (never creates one)."""

    @abstractmethod
    async def touch_session(self, session: str, ttl: float) -> None:
        """Push the record's expiry back."""

    @abstractmethod
    async def drop_session(self, session: str) -> None:
        """Forget the record: every replica answers 404 for the session from now on."""

    @abstractmethod
    async def acquire(self, session: str, stream: str, owner: str, ttl: float) -> bool:
        """Take the lease of a request's stream for ``ttl`` seconds, if nobody holds it.

        One atomic set-if-absent: of two replicas receiving the same request
        at once (a balancer retrying a POST), exactly one gets True and runs
        it. False while another replica runs it, or once it was answered
        (:data:`FINISHED`).
        """

    @abstractmethod
    async def renew(self, leases: Iterable[tuple[str, str]], owner: str, ttl: float) -> list[bool]:
        """Extend leases held by ``owner``; False where the lease was lost."""

    @abstractmethod
    async def release(self, session: str, stream: str, owner: str) -> None:
        """The request was answered: its lease becomes :data:`FINISHED` (if ``owner`` held it)."""

    @abstractmethod
    async def abandon(self, session: str, stream: str, owner: str) -> None:
        """The request stopped unanswered here: drop the lease (if ``owner`` held it)."""

    @abstractmethod
    async def owner(self, session: str, stream: str) -> str | None:
        """The replica holding a stream's lease, :data:`FINISHED`, or None (lapsed, unknown)."""

    @abstractmethod
    async def claim_end(self, session: str, stream: str, ttl: float) -> bool:
        """True for exactly one caller: the one that ends a stream whose lease lapsed."""


# ---------------------------------------------------------------- memory


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

    async def touch_session(self, session: str, ttl: float) -> None:
        record = await self.get_session(session)
        if record is not None:
            self._state.records[session] = (self._state.records[session][0], _deadline(ttl))

    async def drop_session(self, session: str) -> None:
        self._state.records.pop(session, None)

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
            self._state.leases[(session, stream)] = (FINISHED, _deadline(_FINISHED_TTL))

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


# ---------------------------------------------------------------- redis

# Compare-and-delete / compare-and-extend: only the holder may release or renew.
_RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end return 0"
)
_ABANDON = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end"
_RENEW = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)
_UPDATE = (
    "if redis.call('EXISTS', KEYS[1]) == 1 then "
    "redis.call('HSET', KEYS[1], unpack(ARGV)) return 1 end return 0"
)


class RedisRegistry(Registry):
    """The registry on Redis (standalone, Sentinel or Cluster): keys beside the session's own."""

    def __init__(self, redis: OnRedis) -> None:
        # Here, not at the top: an app on a memory store never imports redis-py.
        from ...backends.redis import keys

        self._key_base = redis.key_base
        self._client = redis.client
        self._keys = keys

    def _base(self, session: str) -> str:
        """The backend's hash-tagged base of the session's keys: ours land in the same slot."""
        return self._key_base(session)

    def _record(self, session: str) -> str:
        return self._keys.registry(self._base(session))

    def _lease(self, session: str, stream: str) -> str:
        return self._keys.registry_lease(self._base(session), stream)

    def _end(self, session: str, stream: str) -> str:
        return self._keys.registry_end(self._base(session), stream)

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except StorageError:
            raise
        except Exception as exc:  # redis.RedisError and cluster errors alike
            from ...backends.redis.client import storage_error

            raise storage_error(f"session registry {what}", exc) from exc

    async def put_session(self, session: str, fields: dict[str, str], ttl: float | None) -> None:
        key = self._record(session)

        async def write() -> None:
            await self._client.delete(key)
            await self._client.hset(key, mapping=fields)
            if ttl is not None:
                await self._client.pexpire(key, int(ttl * 1000))

        await self._call("write", write())

    async def get_session(self, session: str) -> dict[str, str] | None:
        raw = await self._call("read", self._client.hgetall(self._record(session)))
        if not raw:
            return None
        return {_text(k): _text(v) for k, v in raw.items()}

    async def update_session(self, session: str, fields: dict[str, str]) -> None:
        args = [part for item in fields.items() for part in item]
        await self._call("update", self._client.eval(_UPDATE, 1, self._record(session), *args))

    async def touch_session(self, session: str, ttl: float) -> None:
        await self._call("touch", self._client.pexpire(self._record(session), int(ttl * 1000)))

    async def drop_session(self, session: str) -> None:
        await self._call("drop", self._client.delete(self._record(session)))

    async def acquire(self, session: str, stream: str, owner: str, ttl: float) -> bool:
        key = self._lease(session, stream)
        taken = await self._call("lease", self._client.set(key, owner, nx=True, px=int(ttl * 1000)))
        return bool(taken)

    async def renew(self, leases: Iterable[tuple[str, str]], owner: str, ttl: float) -> list[bool]:
        kept = []
        for session, stream in leases:
            key = self._lease(session, stream)
            done = await self._call(
                "renew", self._client.eval(_RENEW, 1, key, owner, int(ttl * 1000))
            )
            kept.append(bool(done))
        return kept

    async def release(self, session: str, stream: str, owner: str) -> None:
        await self._call(
            "release",
            self._client.eval(
                _RELEASE,
                1,
                self._lease(session, stream),
                owner,
                FINISHED,
                int(_FINISHED_TTL * 1000),
            ),
        )

    async def abandon(self, session: str, stream: str, owner: str) -> None:
        key = self._lease(session, stream)
        await self._call("abandon", self._client.eval(_ABANDON, 1, key, owner))

    async def owner(self, session: str, stream: str) -> str | None:
        raw = await self._call("lease read", self._client.get(self._lease(session, stream)))
        return None if raw is None else _text(raw)

    async def claim_end(self, session: str, stream: str, ttl: float) -> bool:
        key = self._end(session, stream)
        won = await self._call("claim", self._client.set(key, "1", nx=True, px=int(ttl * 1000)))
        return bool(won)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def registry_for(coordination: Coordination) -> Registry:
    """The registry a backend's coordination declares: in its store, beside the events."""
    if isinstance(coordination, OnRedis):
        return RedisRegistry(coordination)
    return MemoryRegistry(coordination.scope)

"""The session registry on Redis (standalone, Sentinel or Cluster): keys beside the session's own.

Every key carries the session's hash tag (behind the backend's key base), so
on a cluster the record, the leases and the end claims live in the slot of
the session's events. Releasing and renewing a lease compare its holder and
act in one script: only the holder may.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from redis.asyncio.cluster import RedisCluster

from ....errors import StorageError
from ...session_registry import FINISHED, FINISHED_TTL, Registry, holder_field, holders
from .. import keys
from ..errors import mapped, storage_error
from ..marker import COUNT_LUA, StoreMarker
from ..wire import Wire, pack_args

__all__ = ["RedisRegistry"]

logger = logging.getLogger(__name__)

#: The record's field naming the store's era it was written in (:mod:`..marker`).
ERA = "era"

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
# A field raised to an event id, never lowered: ids compare by position (the
# digits after the epoch's dash); a field that is not an event id is replaced.
_RAISE = (
    "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end "
    "local function pos(v) local p = v and string.match(v, '^%x+%-(%d+)') "
    "return p and tonumber(p) or -1 end "
    "if pos(redis.call('HGET', KEYS[1], ARGV[1])) >= pos(ARGV[2]) then return 0 end "
    "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1"
)
# The replica named in the record and the record read, in one step; nothing is
# created when there is no record (an empty reply).
_HOLD = (
    "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], '1') "
    "return redis.call('HGETALL', KEYS[1]) end return {}"
)
# The record read and dropped in one step: a replica adopting the session either
# named itself before (and is told of the end) or finds no record to name itself in.
_END = "local r = redis.call('HGETALL', KEYS[1]) redis.call('DEL', KEYS[1]) return r"
# The same, and the end counted in the store's marker (KEYS[2]) in that step
# when there was a record: {record, the marker's reply}, or {record, 0, error}
# when only the count failed (the session ended all the same); {} for no record.
_END_COUNTED = (
    "local r = redis.call('HGETALL', KEYS[1]) if #r == 0 then return {} end "
    "redis.call('DEL', KEYS[1]) local m = KEYS[2] "
    f"local ok, seen = pcall(function() {COUNT_LUA} end) "
    "if ok then return {r, seen} end "
    "return {r, 0, type(seen) == 'table' and seen.err or tostring(seen)}"
)
_END_COUNTED_HEAD = b"*6\r\n" + pack_args(("EVAL", _END_COUNTED, 2))  # packed once


class RedisRegistry(Registry):
    """The registry on Redis (standalone, Sentinel or Cluster): keys beside the session's own.

    Its commands go over the backend's :class:`~replaystore.backends.redis.wire.Wire`
    (by hand where the client allows, else through redis-py): a resume on a
    replica that does not serve its session reads the record first, and a
    failed one drops it, so on those paths a command through redis-py's
    client cost the replica about as much CPU again as the resume's own read.
    """

    def __init__(
        self,
        wire: Wire,
        key_base: Callable[[str], str],
        marker: StoreMarker | None = None,
        end_restored: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self._key_base = key_base
        self._wire = wire
        self._marker = marker
        self._end_restored = end_restored
        # One server holds the record and the marker: a script may touch both (a
        # cluster keeps them in two slots, so the end and its count are two calls).
        self._one_server = not isinstance(wire.client, RedisCluster)

    def _base(self, session: str) -> str:
        """The backend's hash-tagged base of the session's keys: ours land in the same slot."""
        return self._key_base(session)

    def _record(self, session: str) -> str:
        return keys.registry(self._base(session))

    def _lease(self, session: str, stream: str) -> str:
        return keys.registry_lease(self._base(session), stream)

    def _end(self, session: str, stream: str) -> str:
        return keys.registry_end(self._base(session), stream)

    async def _call(self, what: str, *command: Any) -> Any:
        with mapped(f"session registry {what}", self._wire.client):
            return await self._wire.command(command)

    async def _with_marker(self, what: str, command: tuple[Any, ...]) -> Any:
        """``command``'s reply, the store's marker read in the same packet and taken in
        (unless read a moment ago: :data:`..marker.FRESH`)."""
        marker = self._marker
        if marker is None or not marker.due():
            return await self._call(what, *command)
        with mapped(f"session registry {what}"):
            # shared with the other calls ready, as a single command is
            reply, seen = await self._wire.shared_pipeline([command, marker.read])
            for answer in (reply, seen):
                if isinstance(answer, Exception):
                    raise answer
            await marker.seen(seen)
        return reply

    async def _trusted(self, session: str, raw: Any) -> dict[str, str] | None:
        """The record in ``raw``; None for one written before the store went back in time,
        whose session ends here: its tombstone (``store_restored``) tells every request why."""
        if not raw:
            return None
        record = _pairs(raw)
        era = record.pop(ERA, None)  # the registry's own: not one of the caller's fields
        if self._marker is None or self._marker.trusts(era):
            return record
        await self._call("drop", "DEL", self._record(session))
        if self._end_restored is not None:
            await self._end_restored(session, "")
        return None

    async def look_back(self) -> None:
        if self._marker is None:
            return
        with mapped("reading the store's marker"):
            await self._marker.look()

    async def put_session(self, session: str, fields: dict[str, str], ttl: float | None) -> None:
        key = self._record(session)
        if self._marker is not None:
            with mapped("reading the store's marker"):  # once per process: the record's era
                fields = {**fields, ERA: await self._marker.known()}
        pairs = [part for item in fields.items() for part in item]
        commands: list[tuple[Any, ...]] = [("DEL", key), ("HSET", key, *pairs)]
        if ttl is not None:
            commands.append(("PEXPIRE", key, int(ttl * 1000)))
        with mapped("session registry write", self._wire.client):  # one packet: replaced whole
            replies = await self._wire.pipeline(commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise storage_error("session registry write", reply, self._wire.client)

    async def get_session(self, session: str) -> dict[str, str] | None:
        raw = await self._with_marker("read", ("HGETALL", self._record(session)))
        return await self._trusted(session, raw)

    async def update_session(self, session: str, fields: dict[str, str]) -> None:
        args = [part for item in fields.items() for part in item]
        await self._call("update", "EVAL", _UPDATE, 1, self._record(session), *args)

    async def raise_mark(self, session: str, name: str, mark: str) -> None:
        await self._call("mark", "EVAL", _RAISE, 1, self._record(session), name, mark)

    async def touch_session(self, session: str, ttl: float) -> None:
        await self._call("touch", "PEXPIRE", self._record(session), int(ttl * 1000))

    async def drop_session(self, session: str) -> None:
        await self._call("drop", "DEL", self._record(session))

    async def hold(self, session: str, replica: str) -> dict[str, str] | None:
        command = ("EVAL", _HOLD, 1, self._record(session), holder_field(replica))
        return await self._trusted(session, await self._with_marker("adopt", command))

    async def end_session(self, session: str) -> frozenset[str] | None:
        marker, record = self._marker, self._record(session)
        if marker is not None and self._one_server:
            # Ended and counted in one step: one round trip, not two.
            fresh = marker.fresh()
            packet = _END_COUNTED_HEAD + pack_args((record, marker.key, fresh))
            with mapped("session registry drop", self._wire.client):
                out = await self._wire.call(
                    packet, lambda: ("EVAL", _END_COUNTED, 2, record, marker.key, fresh)
                )
            if not out:
                return None
            raw = out[0]
            try:
                with mapped("counting an ended session"):
                    if len(out) > 2:
                        raise StorageError(_text(out[2]))
                    await marker.seen(out[1])
            except StorageError as exc:  # the session ended; only the count is missing
                logger.warning("the end of session %s was not counted: %s", session, exc)
            return holders(_pairs(raw)) or None
        raw = await self._call("drop", "EVAL", _END, 1, record)
        if raw and marker is not None:
            try:  # a lasting fact: a store restored to before it lost it
                with mapped("counting an ended session"):
                    await marker.counted()
            except StorageError as exc:  # the session ended; only the count is missing
                logger.warning("the end of session %s was not counted: %s", session, exc)
        return (holders(_pairs(raw)) or None) if raw else None

    async def acquire(self, session: str, stream: str, owner: str, ttl: float) -> bool:
        key = self._lease(session, stream)
        taken = await self._call("lease", "SET", key, owner, "NX", "PX", int(ttl * 1000))
        return bool(taken)

    async def renew(self, leases: Iterable[tuple[str, str]], owner: str, ttl: float) -> list[bool]:
        kept = []
        for session, stream in leases:
            key = self._lease(session, stream)
            done = await self._call("renew", "EVAL", _RENEW, 1, key, owner, int(ttl * 1000))
            kept.append(bool(done))
        return kept

    async def release(self, session: str, stream: str, owner: str) -> None:
        lease = self._lease(session, stream)
        ttl = int(FINISHED_TTL * 1000)
        await self._call("release", "EVAL", _RELEASE, 1, lease, owner, FINISHED, ttl)

    async def abandon(self, session: str, stream: str, owner: str) -> None:
        key = self._lease(session, stream)
        await self._call("abandon", "EVAL", _ABANDON, 1, key, owner)

    async def owner(self, session: str, stream: str) -> str | None:
        raw = await self._call("lease read", "GET", self._lease(session, stream))
        return None if raw is None else _text(raw)

    async def claim_end(self, session: str, stream: str, ttl: float) -> bool:
        key = self._end(session, stream)
        won = await self._call("claim", "SET", key, "1", "NX", "PX", int(ttl * 1000))
        return bool(won)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _pairs(raw: Any) -> dict[str, str]:
    """A hash as ``HGETALL`` (or a script returning its reply) gives it: pairs, or a map."""
    if isinstance(raw, dict):  # through redis-py, or a RESP3 map
        return {_text(k): _text(v) for k, v in raw.items()}
    return {_text(raw[i]): _text(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}

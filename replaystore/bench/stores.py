"""What the storm drives: one small adapter per store, all with the same four calls.

Every adapter stores events of ``(session, stream)`` and resumes a stream from
a cursor. ``resume`` is told which stream the client is reconnecting (an HTTP
layer knows it: the GET stream, or the request it resumes); a store whose API
has no place for it ignores it. What each store answers is judged elsewhere
(:mod:`replaystore.bench.truth`) against the ground truth the storm recorded.

This module holds replaystore and the two raw floors (Redis Streams, and plain
lists in memory); the MCP peers are in :mod:`replaystore.bench.peers`.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from ..buffer import ReplayBuffer
from ..cursor import Cursor
from .payloads import payload

__all__ = [
    "EVICTED_PREFIX",
    "RawMemoryStore",
    "RawStreamStore",
    "ReplaystoreStore",
    "Reply",
    "Store",
    "StoreSpec",
    "is_cluster_url",
    "is_plain_redis_url",
    "is_redis_url",
    "node_urls",
]

EVICTED_PREFIX = "ev-"
"""Sessions whose names start with this live in each store's small-retention instance."""

_PAYLOADS = 64  # distinct payloads cycled through (all 200 bytes)


def is_redis_url(url: str) -> bool:
    """A URL of one Redis or of a Redis Cluster (the storm runs replica processes on it)."""
    return url.split(":", 1)[0].lower() in ("redis", "rediss", "redis+cluster", "rediss+cluster")


def is_cluster_url(url: str) -> bool:
    return url.split(":", 1)[0].lower() in ("redis+cluster", "rediss+cluster")


def is_plain_redis_url(url: str) -> bool:
    """One Redis server (what the peers' single-node clients and ``--http`` need)."""
    return is_redis_url(url) and not is_cluster_url(url)


def node_urls(url: str) -> list[str]:
    """``redis://`` URLs of every node a ``redis+cluster://`` URL lists (or ``[url]``)."""
    if not is_cluster_url(url):
        return [url]
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    scheme = "rediss" if parts.scheme.lower().startswith("rediss") else "redis"
    auth, _, hosts = parts.netloc.rpartition("@")
    return [f"{scheme}://{auth + '@' if auth else ''}{h}/0" for h in hosts.split(",") if h]


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """Everything a replica process needs to build a store (picklable)."""

    name: str
    url: str
    prefix: str  # key prefix of this run and store: cleaned up afterwards
    retention: int  # events kept: per session (replaystore), per stream (the others)
    small_retention: int  # the same, for the sessions of the evicted case


@dataclass(slots=True)
class Reply:
    """What one reconnect got: the replayed event ids, or an explicit failure."""

    events: list[str] | None  # None: nothing was replayed (failure, or "not found")
    failed: bool  # the store said it cannot resume (the client re-initializes)
    verdict: str  # replaystore's verdict, or what a peer did ("replayed", "returned_none")


class Store(Protocol):
    name: str

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def open(self, session: str) -> None: ...

    async def append(self, session: str, stream: str, i: int) -> str: ...

    async def resume(self, session: str, stream: str, cursor: str) -> Reply: ...

    def forge_ahead(self, cursor: str) -> str:
        """An id of this store's form that it has not issued yet (a newer replica's)."""
        ...


def redis_client(url: str, *, decode: bool = False) -> Any:
    """A redis-py asyncio client for the peers and the raw floor (hiredis when installed).

    On ``redis+cluster://`` a cluster client, which finds every node from the first.
    """
    import redis.asyncio as aioredis

    if is_cluster_url(url):
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(node_urls(url)[0], decode_responses=decode)
    return aioredis.Redis.from_url(url, decode_responses=decode)


class ReplaystoreStore:
    """replaystore through its public API; a stream is a sequence of the session."""

    name = "replaystore"

    def __init__(self, spec: StoreSpec) -> None:
        options: dict[str, Any] = {}
        small: dict[str, Any] = {}
        if is_redis_url(spec.url):
            options["prefix"] = spec.prefix
            small["prefix"] = spec.prefix + "ev:"
        self._main = ReplayBuffer.from_url(spec.url, max_events=spec.retention, **options)
        self._small = ReplayBuffer.from_url(spec.url, max_events=spec.small_retention, **small)

    def _buf(self, session: str) -> ReplayBuffer:
        return self._small if session.startswith(EVICTED_PREFIX) else self._main

    async def start(self) -> None:
        await self._main.backend.connect()
        await self._small.backend.connect()

    async def aclose(self) -> None:
        await self._main.aclose()
        await self._small.aclose()

    async def open(self, session: str) -> None:
        await self._buf(session).open_session(session)

    async def append(self, session: str, stream: str, i: int) -> str:
        return await self._buf(session).append(session, stream, payload(i % _PAYLOADS))

    async def resume(self, session: str, stream: str, cursor: str) -> Reply:
        res = await self._buf(session).resolve_and_replay(session, cursor, sequence=stream)
        if res.ok:
            return Reply([e.event_id for e in res.events], False, res.verdict.value)
        return Reply(None, True, res.verdict.value)

    def forge_ahead(self, cursor: str) -> str:
        parsed = Cursor.try_parse(cursor)
        if parsed is None:  # an id form this version does not parse: still never issued
            return cursor + "0"
        return str(dataclasses.replace(parsed, position=parsed.position + 1000))


class RawStreamStore:
    """The speed floor on Redis: one stream per (session, stream), XADD and XRANGE, no checks.

    Ids are Redis's own; a resume is ``XRANGE key (cursor +`` on the stream the
    client names, whatever the cursor is. Retention is ``MAXLEN`` (exact).
    """

    name = "raw-streams"

    def __init__(self, spec: StoreSpec) -> None:
        self._spec = spec
        self._r = redis_client(spec.url)

    def _key(self, session: str, stream: str) -> str:
        return f"{self._spec.prefix}{session}:{stream}"

    async def start(self) -> None:
        await self._r.ping()

    async def aclose(self) -> None:
        await self._r.aclose()

    async def open(self, session: str) -> None:
        return None

    async def append(self, session: str, stream: str, i: int) -> str:
        small = session.startswith(EVICTED_PREFIX)
        cap = self._spec.small_retention if small else self._spec.retention
        entry_id = await self._r.xadd(
            self._key(session, stream), {"d": payload(i % _PAYLOADS)}, maxlen=cap, approximate=False
        )
        return _text(entry_id)

    async def resume(self, session: str, stream: str, cursor: str) -> Reply:
        import redis.exceptions

        try:
            entries = await self._r.xrange(self._key(session, stream), min=f"({cursor}", max="+")
        except redis.exceptions.ResponseError:  # not a stream id at all
            return Reply(None, True, "error")
        return Reply([_text(e[0]) for e in entries], False, "replayed")

    def forge_ahead(self, cursor: str) -> str:
        ms, _, _ = cursor.partition("-")
        return f"{int(ms) + 60_000}-0"


class RawMemoryStore:
    """The speed floor in memory: a list per (session, stream), a counter for ids, bisect."""

    name = "raw-memory"

    def __init__(self, spec: StoreSpec) -> None:
        self._spec = spec
        self._streams: dict[tuple[str, str], tuple[list[int], list[bytes]]] = {}
        self._next = 0

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        self._streams.clear()

    async def open(self, session: str) -> None:
        return None

    async def append(self, session: str, stream: str, i: int) -> str:
        ids, data = self._streams.setdefault((session, stream), ([], []))
        self._next += 1
        ids.append(self._next)
        data.append(payload(i % _PAYLOADS))
        cap = (
            self._spec.small_retention
            if session.startswith(EVICTED_PREFIX)
            else self._spec.retention
        )
        if len(ids) > cap:
            del ids[0], data[0]
        return str(self._next)

    async def resume(self, session: str, stream: str, cursor: str) -> Reply:
        ids, _ = self._streams.get((session, stream), ([], []))
        try:
            after = int(cursor)
        except ValueError:
            return Reply(None, True, "error")
        start = bisect.bisect_right(ids, after)
        return Reply([str(i) for i in ids[start:]], False, "replayed")

    def forge_ahead(self, cursor: str) -> str:
        return str(int(cursor) + 1_000_000)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

"""What the storm drives: one small adapter per store, all with the same four calls.

Every adapter stores events of ``(session, stream)`` and resumes a stream from
a cursor. ``resume`` is told which stream the client is reconnecting (an HTTP
layer knows it: the GET stream, or the request it resumes); a store whose API
has no place for it ignores it. What each store answers is judged elsewhere
(:mod:`replaystore.bench.truth`) against the ground truth the storm recorded.

This module holds replaystore and the two raw floors (Redis Streams, and plain
lists in memory); the MCP peers are in :mod:`replaystore.bench.peers`. The
catalog (:data:`CATALOG`) names every store the storm knows and what each
needs, :data:`HTTP_STORES` every row of the storm over HTTP (a store behind
its servers, and their routing); :class:`RedisProbe` reads what a phase cost
the Redis under them.
"""

from __future__ import annotations

import bisect
import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Protocol

from ..buffer import ReplayBuffer
from ..cursor import Cursor
from .workload import EVICTED_PREFIX, payload

__all__ = [
    "CATALOG",
    "EVICTED_PREFIX",
    "FLOOR",
    "HTTP_STORES",
    "Entry",
    "HttpStore",
    "RawMemoryStore",
    "RawStreamStore",
    "RedisProbe",
    "ReplaystoreStore",
    "Reply",
    "Sample",
    "Store",
    "StoreSpec",
    "available",
    "build",
    "default_names",
    "is_cluster_url",
    "is_plain_redis_url",
    "is_redis_url",
    "node_urls",
]

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


# -- the catalog ----------------------------------------------------------------
#
# ``sticky``: the store can only resume a session in the process that created
# it, so its reconnects go back to that replica (sticky routing, as a deployment
# of it must); the others get each reconnect on another replica than the writer.
# ``evicts``: it has a retention limit, so an evicted cursor is really gone.


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    target: str  # "module:Class"
    redis: bool | None  # True: Redis only, False: memory only, None: either
    sticky: bool
    evicts: bool
    what: str
    backend: bool = True  # uses the URL's backend (False: process memory whatever the URL)


CATALOG = {
    e.name: e
    for e in (
        Entry(
            "replaystore",
            "replaystore.bench.stores:ReplaystoreStore",
            None,
            False,
            True,
            "replaystore ReplayBuffer (resolve_and_replay, the stream named)",
        ),
        Entry(
            "raw-streams",
            "replaystore.bench.stores:RawStreamStore",
            True,
            False,
            True,
            "Redis Streams: XADD MAXLEN / XRANGE from the cursor, one stream per SSE stream, "
            "no checks (the speed floor)",
        ),
        Entry(
            "raw-memory",
            "replaystore.bench.stores:RawMemoryStore",
            False,
            False,
            True,
            "a list per SSE stream and bisect, no checks (the speed floor in memory)",
        ),
        Entry(
            "fastmcp",
            "replaystore.bench.peers:FastMCPStore",
            None,
            True,
            True,
            "FastMCP 4 EventStore on py-key-value (Redis or memory), FastMCP's session scoping",
        ),
        Entry(
            "mcp-persist",
            "replaystore.bench.peers:McpPersistStore",
            True,
            False,
            True,
            "mcp-persist RedisEventStore behind its SessionScopedEventStore",
        ),
        Entry(
            "sdk-example",
            "replaystore.bench.peers:SdkExampleStore",
            None,
            True,
            False,
            "the MCP Python SDK example's InMemoryEventStore (one per process, no retention)",
            backend=False,
        ),
    )
}


#: The HTTP storm's floor: the same requests served by a bare ASGI app with one
#: Redis read per resume (:mod:`.floor`), the least a Python server can do.
FLOOR = "floor (sticky)"


@dataclass(frozen=True, slots=True)
class HttpStore:
    """One row of the HTTP storm: a store, its server, its routing."""

    name: str
    store: str  # the --store choice it answers to
    server: str  # "replaystore" (example-server), "floor", or a store of peers.main
    sticky: bool
    redis: bool  # keeps its events in the Redis (its Redis CPU is measured)
    process_local: bool  # sessions live in one process: a killed replica takes them along
    what: str


HTTP_STORES = (
    HttpStore(
        "replaystore (round-robin)",
        "replaystore",
        "replaystore",
        False,
        True,
        False,
        "replaystore example-server replicas on one Redis, round-robin routing",
    ),
    HttpStore(
        "replaystore (sticky)",
        "replaystore",
        "replaystore",
        True,
        True,
        False,
        "replaystore example-server replicas on one Redis, session-affine routing",
    ),
    HttpStore(
        "sdk-example (sticky)",
        "sdk-example",
        "sdk-example",
        True,
        False,
        True,
        "MCP Python SDK server with the SDK example's InMemoryEventStore, session-affine",
    ),
    HttpStore(
        "fastmcp (sticky)",
        "fastmcp",
        "fastmcp",
        True,
        True,
        True,
        "FastMCP 4 server with its EventStore on Redis (py-key-value), session-affine",
    ),
    HttpStore(
        FLOOR,
        "floor",
        "floor",
        True,
        True,
        True,
        "bare ASGI app, a Redis list per session, one LRANGE per resume, session-affine",
    ),
)
"""Every store the HTTP storm runs, in the order of its table."""


def default_names(redis: bool) -> list[str]:
    """Every store that runs on this kind of URL, replaystore first, the raw floor second."""
    return [e.name for e in CATALOG.values() if e.redis is None or e.redis == redis]


def build(spec: StoreSpec) -> Store:
    module, _, cls = CATALOG[spec.name].target.partition(":")
    store: Store = getattr(importlib.import_module(module), cls)(spec)
    return store


def available(name: str, redis: bool, *, cluster: bool = False) -> str | None:
    """``None`` if the store can run here, otherwise why not (said in the output)."""
    entry = CATALOG[name]
    if entry.redis is True and not redis:
        return "needs a redis:// URL"
    if entry.redis is False and redis:
        return "memory:// only (the Redis floor is raw-streams)"
    if cluster and name in ("fastmcp", "mcp-persist"):
        return "not run on redis+cluster:// here (its adapter builds a single-node client)"
    module, _, cls = entry.target.partition(":")
    try:
        getattr(importlib.import_module(module), cls)
        if name == "fastmcp":
            importlib.import_module("fastmcp.server.event_store")
        elif name == "mcp-persist":
            importlib.import_module("mcp_persist")
    except ImportError as exc:  # say which package is missing
        return f"not installed ({exc})"
    return None


# -- what a phase costs the Redis ------------------------------------------------
#
# What the storm costs Redis: server CPU, memory, and where the time went.
#
# Redis CPU is the server's own (``INFO cpu``: ``used_cpu_user`` +
# ``used_cpu_sys``), as a delta over a phase. It is what sets how many resumes
# one Redis core can serve, whatever the clients cost. Memory is the delta of
# ``used_memory`` over the phase that stored the events. ``INFO commandstats``
# (calls and microseconds per command) shows where the server time went. All of
# it is only meaningful on a Redis nobody else is using during the run.


@dataclass(frozen=True, slots=True)
class Sample:
    cpu_s: float
    used_memory: int
    commands: dict[str, tuple[int, int]]  # command -> (calls, usec)

    def minus(self, before: Sample) -> dict[str, Any]:
        stats = {}
        for name, (calls, usec) in self.commands.items():
            c0, u0 = before.commands.get(name, (0, 0))
            if calls - c0 > 0 and name not in ("info", "scan", "unlink", "ping"):
                stats[name] = {"calls": calls - c0, "usec": usec - u0}
        return {
            "cpu_s": self.cpu_s - before.cpu_s,
            "memory_bytes": self.used_memory - before.used_memory,
            "commandstats": dict(sorted(stats.items(), key=lambda kv: -kv[1]["usec"])),
        }


class RedisProbe:
    """Side connections to the storm's Redis for INFO and for cleaning up a store's keys.

    On a Redis Cluster one connection per node the URL lists (every master, as
    the storm expects), and every figure is the sum over them.
    """

    def __init__(self, url: str) -> None:
        self._nodes: list[Any] = [redis_client(u) for u in node_urls(url)]

    async def aclose(self) -> None:
        for r in self._nodes:
            await r.aclose()

    async def server(self) -> dict[str, Any]:
        info: dict[str, Any] = await self._nodes[0].info("server")
        out = {k: info.get(k) for k in ("redis_version", "os", "arch_bits", "process_id")}
        if len(self._nodes) > 1:
            out["nodes"] = len(self._nodes)
        return out

    async def sample(self) -> Sample:
        cpu_s = 0.0
        used = 0
        commands: dict[str, tuple[int, int]] = {}
        for r in self._nodes:
            cpu: dict[str, Any] = await r.info("cpu")
            memory: dict[str, Any] = await r.info("memory")
            stats: dict[str, Any] = await r.info("commandstats")
            cpu_s += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
            used += int(memory["used_memory"])
            for key, v in stats.items():
                if isinstance(v, dict):
                    name = key.removeprefix("cmdstat_")
                    calls, usec = commands.get(name, (0, 0))
                    commands[name] = (calls + int(v["calls"]), usec + int(v["usec"]))
        return Sample(cpu_s, used, commands)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key that starts with ``prefix`` (SCAN + UNLINK); return how many.

        One key per UNLINK: a cluster node refuses a command whose keys are in
        different slots, even slots of its own.
        """
        deleted = 0
        for r in self._nodes:
            batch: list[Any] = []
            async for key in r.scan_iter(match=_escape(prefix) + "*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += await _unlink(r, batch)
                    batch.clear()
            if batch:
                deleted += await _unlink(r, batch)
        return deleted


async def _unlink(r: Any, keys: list[Any]) -> int:
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)
    return sum(int(n) for n in await pipe.execute())


def _escape(prefix: str) -> str:
    """A glob that matches ``prefix`` literally."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)

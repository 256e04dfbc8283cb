"""The stores ``replaystore bench storm`` knows, and what each needs.

``sticky``: the store can only resume a session in the process that created
it, so its reconnects go back to that replica (sticky routing, as a deployment
of it must); the others get each reconnect on another replica than the writer.
``evicts``: it has a retention limit, so an evicted cursor is really gone.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .stores import Store, StoreSpec

__all__ = ["CATALOG", "Entry", "available", "build", "default_names"]


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

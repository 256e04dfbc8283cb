"""(e) Bytes Redis spends per retained event.

One session holds N events (200-byte payloads) spread over several sequences,
appended in bursts that rotate between sequences. ``MEMORY USAGE <key> SAMPLES
0`` (exact: every element is measured) of each of the session's keys, summed
and divided by N, is compared with the payload size and with a bare stream that
holds the same payloads, one field per entry (the baseline). FastMCP 4's
EventStore is measured the same way on one stream of its own.

Each store gets its own logical database on the benchmark's server, so a key
scan finds exactly its keys.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from fastmcp.server.event_store import EventStore
from key_value.aio.stores.redis import RedisStore

from replaystore import ReplayBuffer

from .common import PAYLOAD_BYTES, Sizes, client, message, payload, text

_KEY_ROLES = {"m": "meta hash", "i": "run index", "g": "evicted-element tags"}


def _db_url(url: str, db: int) -> str:
    base = url.rsplit("/", 1)[0] if url.count("/") > 2 else url
    return f"{base}/{db}"


async def _usage(r: aioredis.Redis, key: str) -> dict[str, Any]:
    used = await r.memory_usage(key, samples=0)
    encoding = await r.object("encoding", key)
    kind = await r.type(key)
    return {
        "bytes": int(used or 0),
        "type": text(kind),
        "encoding": text(encoding),
    }


async def _bare_stream(r: aioredis.Redis, key: str, n: int) -> int:
    for start in range(0, n, 1000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(n, start + 1000)):
            pipe.xadd(key, {"d": payload(i)})
        await pipe.execute()
    return int(await r.memory_usage(key, samples=0) or 0)


async def run_memory(url: str, sizes: Sizes) -> dict[str, Any]:
    n = sizes.memory_events
    r = client(_db_url(url, 2))
    try:
        await r.flushdb()
        prefix = "mem:"
        async with ReplayBuffer.from_url(
            "redis://", client=r, prefix=prefix, max_events=2 * n
        ) as buf:
            await buf.open_session("big")
            batch = sizes.memory_batch
            for k, start in enumerate(range(0, n, batch)):
                chunk = [payload(i) for i in range(start, min(n, start + batch))]
                await buf.append_many("big", f"seq{k % sizes.memory_sequences}", chunk)
            info = await buf.session_info("big")
            assert info is not None and info.retained == n, info
        keys: dict[str, dict[str, Any]] = {}
        for raw_key in sorted(await r.keys(f"{prefix}*")):
            key = text(raw_key)
            suffix = key.split("}:", 1)[1]
            role = "sequence lists" if suffix.startswith("q:") else _KEY_ROLES.get(suffix, key)
            usage = {"key": key, **await _usage(r, key)}
            if role in keys:  # one list per sequence: summed
                keys[role]["bytes"] += usage["bytes"]
                keys[role]["key"] = f"{prefix}{{big}}:q:* ({keys[role].get('count', 1) + 1} lists)"
                keys[role]["count"] = keys[role].get("count", 1) + 1
            else:
                keys[role] = usage
        total = sum(k["bytes"] for k in keys.values())
        bare_key = "bare:stream"
        bare = await _bare_stream(r, bare_key, n)
        stored_payload = len(payload(0))
        assert stored_payload == PAYLOAD_BYTES
        out: dict[str, Any] = {
            "events": n,
            "sequences": sizes.memory_sequences,
            "append_batch": sizes.memory_batch,
            "payload_bytes": PAYLOAD_BYTES,
            "replaystore": {
                "keys": keys,
                "total_bytes": total,
                "bytes_per_event": round(total / n, 1),
                "per_key_bytes_per_event": {
                    role: round(k["bytes"] / n, 1) for role, k in keys.items()
                },
                "ratio_to_payload": round(total / n / PAYLOAD_BYTES, 3),
                "ratio_to_bare_stream": round(total / bare, 3),
            },
            "bare_stream": {
                "what": "XADD <key> * d <payload>: the same payloads, one field, auto ids",
                "encoding": (await _usage(r, bare_key))["encoding"],
                "total_bytes": bare,
                "bytes_per_event": round(bare / n, 1),
                "ratio_to_payload": round(bare / n / PAYLOAD_BYTES, 3),
            },
        }
        await r.flushdb()
    finally:
        await r.aclose()
    out["fastmcp"] = await _fastmcp_memory(_db_url(url, 3), sizes, bare / n)
    return out


async def _fastmcp_memory(url: str, sizes: Sizes, bare_per_event: float) -> dict[str, Any]:
    """FastMCP's EventStore: one string key per event plus a JSON id list per stream."""
    n = sizes.fastmcp_memory_events
    r = client(url, decode=True)
    try:
        await r.flushdb()
        store = EventStore(storage=RedisStore(client=r), max_events_per_stream=n)
        for i in range(n):
            await store.store_event("mem-stream", message(i))
        total = 0
        events_total = 0
        list_total = 0
        keys = [text(k) for k in await r.keys("*")]
        for key in keys:
            used = int(await r.memory_usage(key, samples=0) or 0)
            total += used
            if key.startswith("fastmcp_events"):
                events_total += used
            else:
                list_total += used
        await r.flushdb()
    finally:
        await r.aclose()
    return {
        "what": "EventStore(RedisStore) with max_events_per_stream = events, ttl 3600",
        "events": n,
        "keys": len(keys),
        "total_bytes": total,
        "bytes_per_event": round(total / n, 1),
        "event_keys_bytes_per_event": round(events_total / n, 1),
        "stream_list_bytes_per_event": round(list_total / n, 1),
        "ratio_to_payload": round(total / n / PAYLOAD_BYTES, 3),
        "ratio_to_bare_stream": round(total / n / bare_per_event, 3),
    }

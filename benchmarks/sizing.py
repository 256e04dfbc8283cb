"""What each thing replaystore keeps costs Redis, measured: the figures of the sizing rule.

Every key is written through replaystore's own code (a session and its
events, an MCP session record, leases, the markers of answered requests, end
claims, tombstones, the health check's throwaway session, a task, listen
events, the store marker) on a Redis of its own, then weighed with
``MEMORY USAGE <key> SAMPLES 0`` (every element measured). Prints one JSON
object: bytes per item and how long each lives, then a worked example.

    python -m benchmarks.sizing                  # starts a private redis-server
    python -m benchmarks.sizing --url redis://127.0.0.1:6379/15   # a Redis of yours (FLUSHDB!)

docs/deployment.md ("Sizing the store") quotes a run of it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio
import redis.asyncio as aioredis
from mcp.server.subscriptions import ToolsListChanged

from replaystore import ReplayBuffer
from replaystore.backends.coordination import coordination_of
from replaystore.backends.session_registry import FINISHED_TTL
from replaystore.mcp.preflight import check_store
from replaystore.mcp.replicas.replica import END_MEMORY
from replaystore.mcp.subscriptions import StoreSubscriptionBus

#: A JSON-RPC progress notification of about this many bytes: the common MCP event.
EVENT_BYTES = 200
#: Events in the session the per-event cost is read from.
EVENTS = 1_000
PREFIX = "replaystore:"


def _event(i: int) -> bytes:
    head = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t",'
    body = b'"progress":%d,"total":1000,"message":"' % i
    pad = EVENT_BYTES - len(head) - len(body) - 4
    return head + body + b"x" * pad + b'"}}'


async def _weigh(r: aioredis.Redis, pattern: str) -> tuple[int, list[float]]:
    """Bytes of every key matching ``pattern``, and the seconds each has left."""
    total, ttls = 0, []
    async for key in r.scan_iter(match=pattern, count=1000):
        total += int(await r.memory_usage(key, samples=0) or 0)
        ms = await r.pttl(key)
        ttls.append(-1.0 if ms < 0 else ms / 1000)
    return total, ttls


class _Scale:
    """The Redis being weighed, and what was found so far."""

    def __init__(self, r: aioredis.Redis) -> None:
        self.r = r
        self.found: dict[str, Any] = {}

    async def weigh(self, what: str, pattern: str, lives: str, per: str, *, less: int = 0) -> int:
        size, _ = await _weigh(self.r, pattern)
        self.found[what] = {"bytes": size - less, "per": per, "lives": lives}
        return size


async def measure(url: str) -> dict[str, Any]:
    """Every item, weighed on the Redis at ``url`` (its database is flushed first)."""
    r = aioredis.Redis.from_url(url)
    await r.flushdb()
    scale = _Scale(r)
    async with ReplayBuffer.from_url(url, prefix=PREFIX, max_events=EVENTS) as buf:
        await _sessions(scale, buf)
        await _mcp_keys(scale, buf)
        # The health check's deep probe.
        assert await check_store(buf, coordination_of(buf.backend)) == []
        _, ttls = await _weigh(r, f"{PREFIX}{{probe.*")
        await scale.weigh("health check (deep)", f"{PREFIX}{{probe.*", f"{max(ttls):g} s", "check")
        await _tasks_and_listen(scale, buf)
    await r.aclose()
    return scale.found


async def _sessions(scale: _Scale, buf: ReplayBuffer) -> None:
    """A session with one priming event; one with EVENTS events of EVENT_BYTES; a tombstone."""
    await buf.open_session("one")
    await buf.append("one", "_GET_stream", None)
    bare = await scale.weigh(
        "session (its keys, one event)", f"{PREFIX}{{one}}:*", "session_ttl after its last event",
        "session",
    )  # fmt: skip
    await buf.open_session("full")
    for start in range(0, EVENTS, 100):
        await buf.append_many("full", "7", [_event(i) for i in range(start, start + 100)])
    full, _ = await _weigh(scale.r, f"{PREFIX}{{full}}:*")
    scale.found[f"event ({EVENT_BYTES}-byte message)"] = {
        "bytes": round((full - bare) / (EVENTS - 1)),
        "per": "retained event",
        "lives": "until evicted (max_events, max_age) or the session ends",
    }
    await buf.close_session("full")
    await scale.weigh(
        "tombstone (why a session ended)", f"{PREFIX}{{full}}:t", "tombstone_ttl (1 h)",
        "ended session",
    )  # fmt: skip


async def _mcp_keys(scale: _Scale, buf: ReplayBuffer) -> None:
    """What MCP replicas keep beside a session: its record, leases, markers, end claims."""
    registry = coordination_of(buf.backend).registry()
    anchor = await buf.append("one", "_GET_stream", None)
    client = json.dumps(
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {"sampling": {}, "elicitation": {}},
            "clientInfo": {"name": "some-client", "version": "1.2.3"},
        }
    )
    fields = {"version": "2025-11-25", "client": client, "owner": "", "get": anchor}
    fields["held:" + "r" * 32] = "1"
    await registry.put_session("one", fields, buf.retention.session_ttl)
    record = f"{PREFIX}{{one}}:mcp"
    size = await scale.weigh("MCP session record", record, "session_ttl, renewed", "session")
    await registry.hold("one", "s" * 32)
    await scale.weigh(
        "MCP record: one more serving replica", record, "with the record", "replica", less=size
    )
    lease = f"{PREFIX}{{one}}:mcp:lease:42"
    await registry.acquire("one", "42", "r" * 32, 30.0)
    await scale.weigh("lease of a running request", lease, "lease_ttl, renewed", "request")
    await registry.release("one", "42", "r" * 32)
    await scale.weigh(
        "answered-request marker", lease, f"{FINISHED_TTL:g} s after the answer",
        "request answered in the last hour",
    )  # fmt: skip
    await registry.claim_end("one", "43", END_MEMORY)
    await scale.weigh(
        "end claim (a lost request ended)", f"{PREFIX}{{one}}:mcp:end:43", f"{END_MEMORY:g} s",
        "request lost",
    )  # fmt: skip


async def _tasks_and_listen(scale: _Scale, buf: ReplayBuffer) -> None:
    """A finished task (2026-07-28 tasks extension), and listen events."""
    coordination = coordination_of(buf.backend)
    store = coordination.task_store(namespace="server")
    await store.create("t1", runner="r1", lease=30.0, ttl_ms=3_600_000)
    result = {"content": [{"type": "text", "text": "x" * 200}]}
    await store.finish("t1", "completed", result=result, runner="r1")
    await scale.weigh(
        "task (finished, 200-byte result)", f"{PREFIX}{{task:server:t1}}:*", "the task's ttl",
        "task",
    )  # fmt: skip
    bus = StoreSubscriptionBus(keep=10_000)
    bus.bind(buf)
    for _ in range(1_000):
        await bus.publish(ToolsListChanged())
    size, _ = await _weigh(scale.r, f"{PREFIX}{{listen}}:*")
    scale.found["listen event"] = {
        "bytes": round(size / 1_000),
        "per": "event",
        "lives": "until trimmed (keep: 10,000)",
    }


def worked_example(found: dict[str, Any]) -> dict[str, Any]:
    """10,000 open sessions of 200 events, 50,000 requests an hour, 1,000 tasks, 500 ends."""
    b = {what: item["bytes"] for what, item in found.items()}
    event = b[f"event ({EVENT_BYTES}-byte message)"]
    parts = {
        "sessions": 10_000 * (b["session (its keys, one event)"] + b["MCP session record"]),
        "events": 10_000 * 200 * event,
        "answered-request markers": 50_000 * b["answered-request marker"],
        "tasks": 1_000 * b["task (finished, 200-byte result)"],
        "tombstones": 500 * b["tombstone (why a session ended)"],
    }
    total = sum(parts.values())
    return {
        "case": "10,000 open sessions x 200 retained 200-byte events, 50,000 requests "
        "answered in the last hour, 1,000 tasks kept, 500 sessions ended in the last hour",
        "bytes": parts,
        "total_mib": round(total / (1 << 20), 1),
        "maxmemory_mib (total x 1.5)": round(total * 1.5 / (1 << 20)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a Redis database to FLUSH and fill (default: a private one)")
    args = parser.parse_args()
    if args.url:
        found = anyio.run(measure, args.url)
    else:
        from replaystore.testing.servers import redis_server_binary, start_standalone

        with start_standalone(redis_server_binary(), "redis") as server:
            found = anyio.run(measure, server.url)
    print(json.dumps({"items": found, "example": worked_example(found)}, indent=2))


if __name__ == "__main__":
    main()

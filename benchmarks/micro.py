"""Single-client micro benchmarks (a, b, c): append and replay, each paired with a raw baseline.

* replaystore (``redis://``) shares one redis-py client with its raw baseline
  (``XADD`` / pipelined ``XADD`` / ``XRANGE``), so both go over the same pooled
  connection, one awaited call at a time.
* FastMCP 4's ``EventStore`` runs over py-key-value's ``RedisStore``, which
  needs ``decode_responses=True``; its raw baselines use one client of that
  kind, shared with the store, so the comparison stays like for like.
"""

from __future__ import annotations

import timeit
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis.asyncio as aioredis
from fastmcp.server.event_store import EventStore
from key_value.aio.stores.redis import RedisStore
from mcp.server.streamable_http import EventMessage
from mcp_types import JSONRPCNotification

from replaystore import ReplayBuffer

from .common import Row, Sizes, client, count_inner_commands, message, paired, payload, text

_VARIETY = 256  # distinct payloads cycled through

Op = Callable[[int], Awaitable[object]]


async def _fill_stream(r: aioredis.Redis, key: str, values: list[Any], **xadd: Any) -> list[str]:
    """XADD ``values`` (pipelined in chunks) and return the entry ids as str."""
    ids: list[str] = []
    for start in range(0, len(values), 500):
        pipe = r.pipeline(transaction=False)
        for value in values[start : start + 500]:
            pipe.xadd(key, {"d": value}, **xadd)
        out = await pipe.execute()
        ids.extend(text(x) for x in out)
    return ids


async def _buffer(stack: AsyncExitStack, r: aioredis.Redis, prefix: str, **kw: Any) -> ReplayBuffer:
    return await stack.enter_async_context(
        ReplayBuffer.from_url("redis://", client=r, prefix=prefix, **kw)
    )


async def replaystore_rows(url: str, sizes: Sizes) -> tuple[list[Row], dict[str, Any]]:
    """(a) append and (b) replay for replaystore, plus the inner-command profile of each."""
    rows: list[Row] = []
    profile: dict[str, Any] = {}
    payloads = [payload(i) for i in range(_VARIETY)]
    r = client(url)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(r.aclose)
        big = 10**7  # retention far above anything written: no eviction on these paths
        buf = await _buffer(stack, r, "bench:a:", max_events=big)
        ops = await _append_rows(stack, r, buf, payloads, sizes, rows)
        await _replay_rows(r, buf, payloads, sizes, rows, profile)
        # -- inner commands per call (INFO commandstats) --------------------
        for label, op, calls in (
            ("raw XADD", ops.raw_xadd, 200),
            ("replaystore append (below cap)", ops.append, 200),
            ("replaystore append (at cap, evicts 1)", ops.append_capped, 200),
            ("replaystore append_many(16)", ops.append16, 50),
            ("raw pipeline of 16 XADD", ops.raw_pipe16, 50),
        ):
            profile[label] = await count_inner_commands(r, partial(op, 0), calls)
    return rows, profile


@dataclass(frozen=True, slots=True)
class _AppendOps:
    """The append calls :func:`replaystore_rows` profiles after timing them."""

    append: Op
    raw_xadd: Op
    append_capped: Op
    append16: Op
    raw_pipe16: Op


async def _append_rows(
    stack: AsyncExitStack,
    r: aioredis.Redis,
    buf: ReplayBuffer,
    payloads: list[bytes],
    sizes: Sizes,
    rows: list[Row],
) -> _AppendOps:
    """(a): one event, at the retention cap, 16 at once, and memory://, each against XADD."""
    rs_append, raw_xadd = await _append_one(r, buf, payloads, sizes, rows)
    rs_append_capped = await _append_at_cap(stack, r, payloads, sizes, rows)
    rs_append16, raw_pipe16 = await _append_batch(r, buf, payloads, sizes, rows)
    await _append_memory(stack, raw_xadd, payloads, sizes, rows)
    return _AppendOps(rs_append, raw_xadd, rs_append_capped, rs_append16, raw_pipe16)


async def _append_one(
    r: aioredis.Redis,
    buf: ReplayBuffer,
    payloads: list[bytes],
    sizes: Sizes,
    rows: list[Row],
) -> tuple[Op, Op]:
    """One event per awaited call, below the retention cap, against a raw ``XADD``."""
    await buf.open_session("append")

    async def rs_append(i: int) -> object:
        return await buf.append("append", "s1", payloads[i % _VARIETY])

    async def raw_xadd(i: int) -> object:
        return await r.xadd("bench:raw:xadd", {"d": payloads[i % _VARIETY]})

    rows.append(
        await paired(
            "append.redis",
            "append",
            ("replaystore append (redis, 1 event)", rs_append),
            ("raw XADD", raw_xadd),
            ops=sizes.append_ops,
            sizes=sizes,
            note="below the retention cap: nothing evicted",
        )
    )
    return rs_append, raw_xadd


async def _append_at_cap(
    stack: AsyncExitStack,
    r: aioredis.Redis,
    payloads: list[bytes],
    sizes: Sizes,
    rows: list[Row],
) -> Op:
    """At the retention cap (each append evicts the oldest event) against ``XADD MAXLEN``."""
    cap = sizes.capped_retention
    capped = await _buffer(stack, r, "bench:c:", max_events=cap)
    await capped.open_session("capped")
    for start in range(0, cap, 100):
        await capped.append_many("capped", "s1", payloads[: min(100, cap - start)])
    await _fill_stream(r, "bench:raw:capped", payloads[:1] * cap, maxlen=cap, approximate=False)

    async def rs_append_capped(i: int) -> object:
        return await capped.append("capped", "s1", payloads[i % _VARIETY])

    async def raw_xadd_capped(i: int) -> object:
        return await r.xadd(
            "bench:raw:capped", {"d": payloads[i % _VARIETY]}, maxlen=cap, approximate=False
        )

    rows.append(
        await paired(
            "append.redis.at_cap",
            "append",
            (f"replaystore append at cap ({cap} retained)", rs_append_capped),
            (f"raw XADD MAXLEN = {cap}", raw_xadd_capped),
            ops=sizes.append_ops,
            sizes=sizes,
            note="steady state: every append evicts one event",
        )
    )
    return rs_append_capped


async def _append_batch(
    r: aioredis.Redis,
    buf: ReplayBuffer,
    payloads: list[bytes],
    sizes: Sizes,
    rows: list[Row],
) -> tuple[Op, Op]:
    """``append_many`` of 16 against 16 pipelined ``XADD``s."""
    await buf.open_session("batch")
    batch16 = payloads[:16]

    async def rs_append16(i: int) -> object:
        return await buf.append_many("batch", "s1", batch16)

    async def raw_pipe16(i: int) -> object:
        pipe = r.pipeline(transaction=False)
        for p in batch16:
            pipe.xadd("bench:raw:pipe", {"d": p})
        return await pipe.execute()

    rows.append(
        await paired(
            "append_many16.redis",
            "append",
            ("replaystore append_many(16) (redis)", rs_append16),
            ("raw pipeline of 16 XADD", raw_pipe16),
            ops=sizes.batch_ops,
            sizes=sizes,
            note="times are per batch of 16",
        )
    )
    return rs_append16, raw_pipe16


async def _append_memory(
    stack: AsyncExitStack, raw_xadd: Op, payloads: list[bytes], sizes: Sizes, rows: list[Row]
) -> None:
    """A memory:// append, against the same raw ``XADD`` (a network round trip)."""
    mem = await stack.enter_async_context(
        ReplayBuffer.from_url("memory://", max_events=10**7, name="bench-memory")
    )
    await mem.open_session("append")

    async def mem_append(i: int) -> object:
        return await mem.append("append", "s1", payloads[i % _VARIETY])

    rows.append(
        await paired(
            "append.memory",
            "append",
            ("replaystore append (memory://, 1 event)", mem_append),
            ("raw XADD (redis round trip)", raw_xadd),
            ops=sizes.append_ops,
            sizes=sizes,
            note="in-process backend; the baseline is a network round trip",
        )
    )


async def _replay_rows(
    r: aioredis.Redis,
    buf: ReplayBuffer,
    payloads: list[bytes],
    sizes: Sizes,
    rows: list[Row],
    profile: dict[str, Any],
) -> None:
    """(b): replay of N events against ``XRANGE COUNT N``; the inner commands of 100."""
    for n in (10, 100):
        session = f"replay{n}"
        await buf.open_session(session)
        ids = await buf.append_many(session, "s1", payloads[: n + 1])
        cursor = ids[0]
        check = await buf.resolve_and_replay(session, cursor)
        assert check.ok and len(check.events) == n, check
        raw_ids = await _fill_stream(r, f"bench:raw:replay{n}", payloads[: n + 1])
        after = "(" + raw_ids[0]
        assert len(await r.xrange(f"bench:raw:replay{n}", min=after, count=n) or []) == n

        async def rs_replay(i: int, session: str = session, cursor: str = cursor) -> object:
            return await buf.resolve_and_replay(session, cursor)

        async def raw_xrange(
            i: int, key: str = f"bench:raw:replay{n}", after: str = after, n: int = n
        ) -> object:
            return await r.xrange(key, min=after, count=n)

        rows.append(
            await paired(
                f"replay{n}.redis",
                "replay",
                (f"replaystore resolve_and_replay ({n} events)", rs_replay),
                (f"raw XRANGE COUNT {n}", raw_xrange),
                ops=sizes.replay_ops * (4 if n == 10 else 1),
                sizes=sizes,
            )
        )
        if n == 100:
            profile["replaystore resolve_and_replay (100 events)"] = await count_inner_commands(
                r, partial(rs_replay, 0), 30
            )
            profile["raw XRANGE COUNT 100"] = await count_inner_commands(
                r, partial(raw_xrange, 0), 30
            )


async def fastmcp_rows(url: str, sizes: Sizes) -> tuple[list[Row], dict[str, Any], dict[str, Any]]:
    """(c) FastMCP 4's EventStore over py-key-value's RedisStore, same measurements."""
    rows: list[Row] = []
    profile: dict[str, Any] = {}
    messages = [message(i) for i in range(_VARIETY)]
    r = client(url, decode=True)  # RedisStore only understands str replies
    info: dict[str, Any] = {
        "storage": "key_value.aio.stores.redis.RedisStore(client=<redis.asyncio.Redis "
        "decode_responses=True>) against the benchmark's own redis-server",
        "event_store": "fastmcp.server.event_store.EventStore(storage=..., ttl=3600)",
    }
    try:
        large, f_store = await _fastmcp_append_rows(r, messages, sizes, rows)
        await _fastmcp_replay_rows(r, large, messages, sizes, rows, profile)
        profile[f"FastMCP store_event ({_FASTMCP_CAP} retained)"] = await count_inner_commands(
            r, partial(f_store, 0), 50
        )
        info["pydantic_dump_us"] = _pydantic_cost(messages[0])
    finally:
        await r.aclose()
    return rows, profile, info


_FASTMCP_CAP = 100
"""FastMCP's default retention per stream."""


async def _fastmcp_append_rows(
    r: aioredis.Redis, messages: list[JSONRPCNotification], sizes: Sizes, rows: list[Row]
) -> tuple[EventStore, Op]:
    """``store_event`` at the default retention and at a large one, against a raw ``XADD``.

    Returns the large store (the replays read from it) and the default store's call.
    """
    texts = [m.model_dump_json(by_alias=True) for m in messages]
    default_cap = _FASTMCP_CAP
    small = EventStore(storage=RedisStore(client=r), max_events_per_stream=default_cap)
    large_cap = sizes.fastmcp_big_retention
    large = EventStore(storage=RedisStore(client=r), max_events_per_stream=large_cap)

    # Steady state: the stream list is full, each store evicts one event.
    for i in range(default_cap):
        await small.store_event("f-append", messages[i % _VARIETY])
    for i in range(large_cap):
        await large.store_event("f-append-large", messages[i % _VARIETY])

    async def f_store(i: int) -> object:
        return await small.store_event("f-append", messages[i % _VARIETY])

    async def f_store_large(i: int) -> object:
        return await large.store_event("f-append-large", messages[i % _VARIETY])

    async def raw_xadd(i: int) -> object:
        return await r.xadd("bench:rawf:xadd", {"d": texts[i % _VARIETY]})

    rows.append(
        await paired(
            "fastmcp.append",
            "fastmcp",
            (f"FastMCP store_event ({default_cap} retained, default)", f_store),
            ("raw XADD (str client)", raw_xadd),
            ops=sizes.fastmcp_append_ops,
            sizes=sizes,
            note="stream list full: each store rewrites the id list and deletes one event",
        )
    )
    rows.append(
        await paired(
            "fastmcp.append.large",
            "fastmcp",
            (f"FastMCP store_event ({large_cap} retained)", f_store_large),
            ("raw XADD (str client)", raw_xadd),
            ops=max(2, sizes.fastmcp_append_ops // 3),
            sizes=sizes,
            note="the id list read and rewritten per store grows with retention",
        )
    )
    return large, f_store


async def _fastmcp_replay_rows(
    r: aioredis.Redis,
    large: EventStore,
    messages: list[JSONRPCNotification],
    sizes: Sizes,
    rows: list[Row],
    profile: dict[str, Any],
) -> None:
    """``replay_events_after`` of N events against ``XRANGE COUNT N``; inner commands of 100."""
    texts = [m.model_dump_json(by_alias=True) for m in messages]
    for n in (10, 100):
        stream = f"f-replay{n}"
        ids = [await large.store_event(stream, messages[i]) for i in range(n + 1)]
        got: list[EventMessage] = []

        async def collect(event: EventMessage, got: list[EventMessage] = got) -> None:
            got.append(event)

        assert await large.replay_events_after(ids[0], collect) == stream
        assert len(got) == n
        raw_ids = await _fill_stream(r, f"bench:rawf:replay{n}", texts[: n + 1])
        start = "(" + raw_ids[0]

        async def f_replay(i: int, cursor: str = ids[0]) -> object:
            sink: list[EventMessage] = []

            async def send(event: EventMessage) -> None:
                sink.append(event)

            return await large.replay_events_after(cursor, send)

        async def raw_xrange(
            i: int, key: str = f"bench:rawf:replay{n}", start: str = start, n: int = n
        ) -> object:
            return await r.xrange(key, min=start, count=n)

        rows.append(
            await paired(
                f"fastmcp.replay{n}",
                "fastmcp",
                (f"FastMCP replay_events_after ({n} events)", f_replay),
                (f"raw XRANGE COUNT {n} (str client)", raw_xrange),
                ops=sizes.fastmcp_replay_ops * (4 if n == 10 else 1),
                sizes=sizes,
            )
        )
        if n == 100:
            profile["FastMCP replay_events_after (100 events)"] = await count_inner_commands(
                r, partial(f_replay, 0), 3
            )


def _pydantic_cost(msg: JSONRPCNotification) -> float:
    """Microseconds FastMCP spends turning one message into a dict (part of its store cost)."""
    loops = 2000
    seconds = timeit.timeit(lambda: msg.model_dump(mode="json", by_alias=True), number=loops)
    return round(seconds / loops * 1e6, 2)

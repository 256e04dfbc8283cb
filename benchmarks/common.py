"""Shared pieces: sizes, paired timing, payloads, the Redis server and clients.

Timing is always *paired*: a subject and its raw baseline run in alternating
rounds inside the same process, against the same server, with the same kind of
client. What is reported is the median per-operation time of each over the
rounds, their ratio, and the spread of the per-round ratios. Absolute numbers
are printed for orientation only; on a shared 2-core machine only the ratios
mean anything.
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import redis.asyncio as aioredis

# every stored event: a 200-byte JSON-RPC notification, the same as the storm's
from replaystore.bench.workload import PAYLOAD_BYTES as PAYLOAD_BYTES
from replaystore.bench.workload import message as message
from replaystore.bench.workload import payload as payload
from replaystore.testing.servers import ServerHandle, redis_server_binary, start_standalone


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each benchmark does; ``QUICK`` is for the smoke test."""

    quick: bool
    rounds: int
    warmup: int
    append_ops: int
    batch_ops: int
    replay_ops: int
    fastmcp_append_ops: int
    fastmcp_replay_ops: int
    capped_retention: int
    fastmcp_big_retention: int
    memory_events: int
    memory_sequences: int
    memory_batch: int
    fastmcp_memory_events: int


FULL = Sizes(
    quick=False,
    rounds=7,
    warmup=200,
    append_ops=400,
    batch_ops=100,
    replay_ops=40,
    fastmcp_append_ops=100,
    fastmcp_replay_ops=8,
    capped_retention=1000,
    fastmcp_big_retention=1000,
    memory_events=100_000,
    memory_sequences=5,
    memory_batch=500,
    fastmcp_memory_events=1000,
)

QUICK = Sizes(
    quick=True,
    rounds=3,
    warmup=5,
    append_ops=20,
    batch_ops=5,
    replay_ops=3,
    fastmcp_append_ops=10,
    fastmcp_replay_ops=2,
    capped_retention=50,
    fastmcp_big_retention=120,
    memory_events=2000,
    memory_sequences=5,
    memory_batch=200,
    fastmcp_memory_events=50,
)


# -- payloads ---------------------------------------------------------------


def text(value: object) -> str:
    """A Redis reply (bytes or str, by client) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


# -- results ----------------------------------------------------------------


@dataclass(slots=True)
class Row:
    """One paired measurement: a subject against its raw baseline."""

    id: str
    group: str
    subject: str
    baseline: str
    subject_us: float
    baseline_us: float
    ratio: float
    ratio_min: float
    ratio_max: float
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Op = Callable[[int], Awaitable[object]]


async def paired(
    row_id: str,
    group: str,
    subject: tuple[str, Op],
    baseline: tuple[str, Op],
    *,
    ops: int,
    sizes: Sizes,
    note: str = "",
) -> Row:
    """Time ``ops`` sequential awaits of each, alternating rounds; return the medians and ratio.

    Each op receives a fresh integer (shared counter) so it can vary its data.
    """
    counter = itertools.count()
    (s_label, s_op), (b_label, b_op) = subject, baseline
    for _ in range(sizes.warmup):
        await s_op(next(counter))
        await b_op(next(counter))
    s_times: list[float] = []
    b_times: list[float] = []
    for r in range(sizes.rounds):
        order: list[tuple[Op, list[float]]] = [(s_op, s_times), (b_op, b_times)]
        if r % 2:
            order.reverse()
        for op, sink in order:
            gc.collect(1)  # young generations only: cheap, and no round inherits garbage
            start = time.perf_counter()
            for _ in range(ops):
                await op(next(counter))
            sink.append((time.perf_counter() - start) / ops)
    per_round = [s / b for s, b in zip(s_times, b_times, strict=True)]
    s_med, b_med = statistics.median(s_times), statistics.median(b_times)
    return Row(
        id=row_id,
        group=group,
        subject=s_label,
        baseline=b_label,
        subject_us=s_med * 1e6,
        baseline_us=b_med * 1e6,
        ratio=s_med / b_med,
        ratio_min=min(per_round),
        ratio_max=max(per_round),
        note=note,
    )


# -- Redis ------------------------------------------------------------------


@contextmanager
def settled_heap() -> Iterator[None]:
    """Collect once and freeze the long-lived heap (pydantic, fastmcp ...) while timing.

    A full collection over that heap costs a fifth of a second here; frozen, the
    collector skips it, so no timed round pays for it by chance.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def redis_server() -> Iterator[ServerHandle]:
    """Our own throw-away redis-server on a free loopback port (never the machine's 6379)."""
    handle = start_standalone(redis_server_binary(), "redis")
    try:
        yield handle
    finally:
        handle.stop()


def client(url: str, *, decode: bool = False) -> aioredis.Redis:
    """A redis-py asyncio client (hiredis parser when installed, default connection pool).

    Sequential awaits use one pooled connection; concurrent tasks each take one.
    """
    return aioredis.Redis.from_url(url, decode_responses=decode)


async def commandstats(r: aioredis.Redis) -> dict[str, tuple[int, int]]:
    """``INFO commandstats`` as {command: (calls, usec)}; commands run by Lua are counted too."""
    info: dict[str, Any] = await r.info("commandstats")
    out: dict[str, tuple[int, int]] = {}
    for key, value in info.items():
        if isinstance(value, dict):
            out[key.removeprefix("cmdstat_")] = (int(value["calls"]), int(value["usec"]))
    return out


async def count_inner_commands(
    r: aioredis.Redis, run: Callable[[], Awaitable[object]], times: int
) -> dict[str, Any]:
    """Redis commands per call of ``run``, and the server time one call costs.

    ``CONFIG RESETSTAT`` first, so only meaningful on a server nobody else uses:
    ours. ``server_us_per_call`` is the time Redis spent executing: the
    function's or script's (FCALL/EVALSHA include their inner commands) or the
    sum of the plain commands'.
    """
    await r.config_resetstat()
    for _ in range(times):
        await run()
    stats = await commandstats(r)
    for noise in ("config|resetstat", "info"):
        stats.pop(noise, None)
    outer = [name for name in ("fcall", "evalsha") if name in stats]
    if outer:  # a function or script: its time includes the commands it ran
        server_usec = sum(stats[name][1] for name in outer)
    else:
        server_usec = sum(usec for _, usec in stats.values())
    calls = {k: round(v[0] / times, 2) for k, v in sorted(stats.items(), key=lambda kv: -kv[1][0])}
    return {
        "calls": calls,
        "inner_commands": round(
            sum(v for k, v in calls.items() if k not in ("evalsha", "fcall")), 2
        ),
        "server_us_per_call": round(server_usec / times, 1),
    }

"""What one replica process does: fill its sessions, then take its share of the storm.

Runs inside a :class:`~replaystore.testing.replicas.ReplicaPool` worker.
Commands (``(name, argument)``): ``open`` (build the store from a
:class:`~replaystore.bench.stores.StoreSpec`), ``fill``, ``storm``, ``close``.
Answers are plain tuples and dicts, so they pickle cheaply.

Time stamps are ``time.monotonic()``: one clock for every process of the
machine, so the coordinator can order an append in one replica against a
resume in another.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from .stores import Reply, Store, build
from .workload import Reconnect, SessionPlan, StreamKey

__all__ = ["serve"]

_PROGRESS_EVERY = 0.25  # seconds between progress messages

Progress = Callable[[int], None]


def serve(conn: Connection) -> None:
    """The replica's main loop (a ``ReplicaPool`` target)."""
    # The peers log a warning per unknown cursor; failures come back over the pipe.
    logging.disable(logging.WARNING)
    asyncio.run(_serve(conn))


async def _serve(conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    store: Store | None = None
    conn.send(("ready", None))
    try:
        while True:
            command = await loop.run_in_executor(None, conn.recv)
            if command is None:
                return
            name, arg = command
            reporter = _Reporter(conn)
            if name == "open":
                store = build(arg)
                await store.start()
                result: Any = None
            elif name == "close":
                if store is not None:
                    await store.aclose()
                store = None
                result = None
            elif store is None:
                raise RuntimeError(f"{name!r} before 'open'")
            elif name == "open_sessions":
                await open_sessions(store, arg["sessions"], arg["concurrency"])
                result = None
            elif name == "fill":
                result = await fill(store, arg["sessions"], arg["concurrency"], reporter)
            elif name == "storm":
                result = await storm(store, reporter, **arg)
            elif name == "sweep":
                result = await sweep(store, reporter, **arg)
            elif name == "idle":
                result = None
            else:
                raise RuntimeError(f"unknown command {name!r}")
            reporter.flush()
            conn.send(("ok", result))
    finally:
        if store is not None:
            await store.aclose()


class _Reporter:
    """Counts work done and sends it to the coordinator a few times a second."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._pending = 0
        self._last = time.monotonic()

    def __call__(self, n: int) -> None:
        self._pending += n
        now = time.monotonic()
        if now - self._last >= _PROGRESS_EVERY:
            self.flush()
            self._last = now

    def flush(self) -> None:
        if self._pending:
            self._conn.send(("progress", self._pending))
            self._pending = 0


async def bounded(jobs: Sequence[Callable[[], Awaitable[object]]], concurrency: int) -> None:
    """Run ``jobs`` with at most ``concurrency`` in flight (workers pulling from one list).

    Every benchmark that keeps many calls in flight runs them through this: the
    storm's replicas, the HTTP storm's clients, ``benchmarks.resume_cpu``. A job
    is a function called when its turn comes, so an interrupted run leaves no
    coroutine behind that was created and never awaited.
    """
    it = iter(jobs)

    async def work() -> None:
        for job in it:
            await job()

    await asyncio.gather(*(work() for _ in range(max(1, min(concurrency, len(jobs))))))


async def open_sessions(store: Store, sessions: list[SessionPlan], concurrency: int) -> None:
    """Open the sessions (before the fill, so that its cost is the appends' alone)."""

    def job(plan: SessionPlan) -> Callable[[], Awaitable[None]]:
        return lambda: store.open(plan.session)

    await bounded([job(p) for p in sessions], concurrency)


async def fill(
    store: Store, sessions: list[SessionPlan], concurrency: int, progress: Progress
) -> dict[str, Any]:
    """Append the sessions' events, streams interleaved; return the ids."""
    truth: dict[StreamKey, list[str]] = {}
    latencies: list[float] = []

    def job(plan: SessionPlan) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            for s in plan.streams:
                truth[(plan.session, s)] = []
            for k in range(plan.events_per_stream):
                for s in plan.streams:
                    began = time.monotonic()
                    truth[(plan.session, s)].append(await store.append(plan.session, s, k))
                    latencies.append(time.monotonic() - began)
            progress(len(plan.streams) * plan.events_per_stream)

        return run

    began = time.monotonic()
    await bounded([job(p) for p in sessions], concurrency)
    return {
        "truth": truth,
        "appends": len(latencies),
        "began": began,
        "ended": time.monotonic(),
        "latencies": latencies,
    }


async def storm(
    store: Store,
    progress: Progress,
    *,
    reconnects: list[Reconnect],
    writes: list[StreamKey],
    rate: float,
    writers: int,
    concurrency: int,
    start_at: float,
    seed: int,
) -> dict[str, Any]:
    """Resume every reconnect (``concurrency`` at once) while writers append at ``rate``/s.

    Each stream has one writer task, so a stream's order is its append order.
    """
    done = asyncio.Event()
    appended: list[tuple[StreamKey, str, float]] = []
    results: list[tuple[int, Reply, float, float]] = []
    failed_writes: list[str] = []
    jobs = _resume_jobs(store, reconnects, results, progress)
    # Every store starts its storm from a collected heap: what the fill left
    # behind (ids, latencies, the store's own garbage) is not collected by
    # chance in the middle of one store's storm and not another's. Done
    # before the common start time, so it costs the storm nothing.
    gc.collect()
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    tasks = [
        asyncio.create_task(
            _write(store, writes[w::writers], writers / rate if rate > 0 else 0.0,
                   random.Random(seed * 7919 + w), done, appended, failed_writes)
        )
        for w in range(writers)
    ]  # fmt: skip
    began = time.monotonic()
    cpu = time.process_time()
    try:
        await bounded(jobs, concurrency)
    finally:
        ended = time.monotonic()
        cpu = time.process_time() - cpu
        done.set()
        await asyncio.gather(*tasks)
    return {
        "results": results,
        "appended": appended,
        "failed_writes": failed_writes,
        "began": began,
        "ended": ended,
        "cpu_s": cpu,  # this process's CPU over the storm (its writers' appends included)
    }


async def _write(
    store: Store,
    mine: list[StreamKey],
    pause: float,
    rng: random.Random,
    done: asyncio.Event,
    appended: list[tuple[StreamKey, str, float]],
    failed: list[str],
) -> None:
    """One writer: an append to one of ``mine`` every ``pause`` seconds until ``done``.

    A stream whose append fails is reported and gets no more writes.
    """
    if not mine or pause <= 0:
        return
    due = time.monotonic()
    n = 0
    while not done.is_set() and mine:
        key = rng.choice(mine)
        try:
            event_id = await store.append(key[0], key[1], n)
        except Exception as exc:  # reported, and that stream gets no more writes
            failed.append(f"{key}: {exc!r}"[:200])
            mine.remove(key)
            continue
        appended.append((key, event_id, time.monotonic()))
        n += 1
        due += pause
        await asyncio.sleep(max(0.0, due - time.monotonic()))


def _resume_jobs(
    store: Store,
    reconnects: list[Reconnect],
    results: list[tuple[int, Reply, float, float]],
    progress: Progress,
) -> list[Callable[[], Awaitable[None]]]:
    """One job per reconnect; the two connections of a "second" reconnect start together."""

    async def resume(r: Reconnect) -> None:
        cursor = store.forge_ahead(r.cursor) if r.kind == "ahead" else r.cursor
        began = time.monotonic()
        reply = await store.resume(r.session, r.stream, cursor)
        results.append((r.id, reply, began, time.monotonic()))
        progress(1)

    def job(group: list[Reconnect]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await asyncio.gather(*(resume(r) for r in group))

        return run

    groups: dict[tuple[str, str], list[Reconnect]] = {}
    for r in reconnects:
        key = (r.session, r.stream) if r.kind == "second" else (str(r.id), "")
        groups.setdefault(key, []).append(r)
    return [job(g) for g in groups.values()]


SWEEP_REPLAY = 10  # events of the stream that is resumed in the history sweep


async def sweep(
    store: Store, progress: Progress, *, sizes: list[int], repeats: int
) -> dict[str, Any]:
    """Resume a 10-event stream of sessions whose other stream holds ``size`` events.

    One caller, no other load: the cost of a resume (9 events replayed) against
    the history the session holds, without the storm's queueing.
    """
    out: dict[str, Any] = {}
    for size in sizes:
        session = f"h-{size:07d}"
        await store.open(session)
        for k in range(size):
            await store.append(session, "_GET_stream", k)
        ids = [await store.append(session, "1", k) for k in range(SWEEP_REPLAY)]
        latencies = []
        replayed = set()
        for _ in range(repeats):
            began = time.monotonic()
            reply = await store.resume(session, "1", ids[0])
            latencies.append(time.monotonic() - began)
            replayed.add(-1 if reply.failed else len(reply.events or []))
        latencies.sort()
        out[str(size)] = {
            "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 3),
            "replayed": sorted(replayed),
        }
        progress(1)
    return out

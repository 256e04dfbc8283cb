"""(d) Reconnect storm: throughput and correctness of resumption under concurrent load.

S sessions, each with 2 or 3 streams named as the MCP SDK names them
(``_GET_stream``, ``"1"``, ``"2"``), are filled with events. Then K concurrent
tasks each resume random streams from random recent cursors for a fixed number
of operations while W writers keep appending (each stream has exactly one
writer, so the ground truth order is the stored order). Every resume is kept
and judged at the end against the ground truth: the ids appended to that
stream, in order.

Outcomes of one resume:

``exact``
    success, and the events are exactly the ones after the cursor in that
    stream: everything appended before the resume started, plus possibly a
    prefix of what was appended while it ran.
``silent_gap``
    success as the client sees it, but events it needed are missing. A FastMCP
    ``replay_events_after`` that returns ``None`` counts here: the MCP SDK has
    already sent ``200`` when replay runs, so the client gets an empty, healthy
    looking stream (``store_returned_none`` counts these separately).
``duplicate``
    an event delivered twice in one replay.
``wrong_stream``
    an event of another stream or session, or the store reported another stream.
``explicit_failure``
    the store said it cannot resume (replaystore's verdicts; ``verdicts`` counts
    which). Correct whenever exact resumption is impossible.

Two more scenarios, without concurrency: ``evicted`` (the cursor fell out of a
small retention window: exact resumption is impossible, so the only correct
outcome is an explicit failure) and ``foreign`` (a client presents another
session's cursor: again only an explicit failure is correct).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastmcp.server.event_store import EventStore
from fastmcp.server.session_scoped_event_store import SessionScopedEventStore
from key_value.aio.stores.redis import RedisStore
from mcp.server.streamable_http import EventMessage

from replaystore import Cursor, ReplayBuffer

from .common import Sizes, client, message, payload, text

STREAM_NAMES = ("_GET_stream", "1", "2")
_SETUP_CONCURRENCY = 50
EVICTED_EXTRA = 5  # events per stream beyond the retention in the evicted scenario

StreamKey = tuple[str, str]


@dataclass(slots=True)
class Reply:
    """What one resume gave the client."""

    events: list[str] | None  # None: the store's "not found" (FastMCP) or a failed verdict
    explicit: bool  # the store failed it explicitly (replaystore verdict)
    verdict: str
    stream: str | None  # the stream the store says it replayed


@dataclass(slots=True)
class Attempt:
    key: StreamKey
    cursor_index: int | None  # None: the cursor is not one of this stream's events
    known_before: int  # events of this stream whose append had returned when the resume began
    reply: Reply


Run = tuple[list[Attempt], float, int]  # attempts, resumers' wall seconds, writes made


@dataclass(slots=True)
class Outcomes:
    attempts: int = 0
    exact: int = 0
    silent_gap: int = 0
    duplicate: int = 0
    wrong_stream: int = 0
    explicit_failure: int = 0
    store_returned_none: int = 0
    events_replayed: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "exact": self.exact,
            "silent_gap": self.silent_gap,
            "duplicate": self.duplicate,
            "wrong_stream": self.wrong_stream,
            "explicit_failure": self.explicit_failure,
            "store_returned_none": self.store_returned_none,
            "events_replayed": self.events_replayed,
            "verdicts": dict(sorted(self.verdicts.items())),
        }


def classify(attempt: Attempt, truth: list[str], out: Outcomes) -> None:
    """Judge one resume against the ground truth of its stream (see the module docstring)."""
    out.attempts += 1
    reply = attempt.reply
    out.verdicts[reply.verdict] += 1
    if reply.explicit:
        out.explicit_failure += 1
        return
    if reply.events is None:
        out.store_returned_none += 1
    ids = reply.events or []
    out.events_replayed += len(ids)
    known = set(truth)
    if (reply.stream is not None and reply.stream != attempt.key[1]) or any(
        i not in known for i in ids
    ):
        out.wrong_stream += 1
    elif len(set(ids)) != len(ids):
        out.duplicate += 1
    elif attempt.cursor_index is None:
        out.silent_gap += 1  # "success" for a cursor that is not this stream's
    else:
        start = attempt.cursor_index + 1
        needed = attempt.known_before - start
        if ids == truth[start : start + len(ids)] and len(ids) >= needed:
            out.exact += 1
        else:
            out.silent_gap += 1


class Store(Protocol):
    name: str

    async def create(self, session: str) -> None: ...

    async def append(self, session: str, stream: str, i: int) -> str: ...

    async def resume(self, session: str, cursor: str) -> Reply: ...


class ReplaystoreStore:
    """replaystore over Redis; a stream is a sequence of the session."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        self.name = "replaystore"
        self.buffer = buffer
        self.payloads = [payload(i) for i in range(64)]

    async def create(self, session: str) -> None:
        await self.buffer.open_session(session)

    async def append(self, session: str, stream: str, i: int) -> str:
        return await self.buffer.append(session, stream, self.payloads[i % 64])

    async def resume(self, session: str, cursor: str) -> Reply:
        res = await self.buffer.resolve_and_replay(session, cursor)
        if res.ok:
            return Reply([e.event_id for e in res.events], False, "resumed", res.sequence)
        return Reply(None, True, res.verdict.value, res.sequence)


class FastMCPStore:
    """FastMCP 4 as it serves MCP: one shared EventStore, one session-scoped adapter per session."""

    def __init__(self, shared: EventStore) -> None:
        self.name = "fastmcp"
        self.shared = shared
        self.scoped: dict[str, SessionScopedEventStore] = {}
        self.messages = [message(i) for i in range(64)]

    async def create(self, session: str) -> None:
        # FastMCP scopes with a random per-transport id, not the MCP session id.
        self.scoped[session] = SessionScopedEventStore(self.shared, session_id=uuid.uuid4().hex)

    async def append(self, session: str, stream: str, i: int) -> str:
        return await self.scoped[session].store_event(stream, self.messages[i % 64])

    async def resume(self, session: str, cursor: str) -> Reply:
        got: list[str] = []

        async def send(event: EventMessage) -> None:
            got.append(str(event.event_id))

        stream = await self.scoped[session].replay_events_after(cursor, send)
        if stream is None:
            return Reply(None, False, "returned_none", None)
        return Reply(got, False, "replayed", stream)


@dataclass(slots=True)
class World:
    """Sessions, their streams, and the ground truth of every stream."""

    streams: list[StreamKey]
    truth: dict[StreamKey, list[str]]


async def _populate(store: Store, sessions: list[str], per_stream: int) -> World:
    truth: dict[StreamKey, list[str]] = {}
    gate = asyncio.Semaphore(_SETUP_CONCURRENCY)

    async def fill(index: int, session: str) -> None:
        async with gate:
            await store.create(session)
            names = STREAM_NAMES[: 2 + index % 2]
            for name in names:
                truth[(session, name)] = []
            for k in range(per_stream):
                for name in names:
                    truth[(session, name)].append(await store.append(session, name, k))

    await asyncio.gather(*(fill(i, s) for i, s in enumerate(sessions)))
    return World(sorted(truth), truth)


async def _storm(
    store: Store,
    world: World,
    sizes: Sizes,
    seed: int,
    resume: Callable[[str, str], Awaitable[Reply]] | None = None,
) -> Run:
    """Run the storm; return the attempts, the resumers' wall time and the writes made."""
    resume = resume or store.resume
    done = asyncio.Event()
    writes = 0
    max_writes_per_writer = 100_000  # a bound; the resumers finish long before

    async def writer(w: int) -> None:
        nonlocal writes
        rng = random.Random(seed * 1000 + w)
        mine = world.streams[w :: sizes.storm_writers]
        for n in range(max_writes_per_writer):
            if done.is_set():
                return
            key = rng.choice(mine)
            event_id = await store.append(key[0], key[1], n)
            world.truth[key].append(event_id)
            writes += 1
            await asyncio.sleep(sizes.storm_write_interval)

    attempts: list[Attempt] = []

    async def resumer(t: int) -> None:
        rng = random.Random(seed * 1000 + 500 + t)
        for _ in range(sizes.storm_ops_per_task):
            key = rng.choice(world.streams)
            ids = world.truth[key]
            known = len(ids)
            index = rng.randrange(max(0, known - sizes.storm_window), known)
            reply = await resume(key[0], ids[index])
            attempts.append(Attempt(key, index, known, reply))

    writers = [asyncio.create_task(writer(w)) for w in range(sizes.storm_writers)]
    start = time.perf_counter()
    try:
        await asyncio.gather(*(resumer(t) for t in range(sizes.storm_tasks)))
    finally:
        elapsed = time.perf_counter() - start
        done.set()
        await asyncio.gather(*writers)
    return attempts, elapsed, writes


def _judge(attempts: list[Attempt], truth: dict[StreamKey, list[str]]) -> Outcomes:
    out = Outcomes()
    for attempt in attempts:
        classify(attempt, truth[attempt.key], out)
    return out


async def _evicted(store: Store, sessions: list[str], retention: int) -> Outcomes:
    """Resume from a cursor that fell out of retention (newer events of its stream remain)."""
    out = Outcomes()
    world = await _populate(store, sessions, retention + EVICTED_EXTRA)
    for session in sessions:
        key = (session, STREAM_NAMES[0])
        ids = world.truth[key]
        reply = await store.resume(session, ids[2])
        classify(Attempt(key, 2, len(ids), reply), ids, out)
    return out


async def _foreign(store: Store, sessions: list[str]) -> Outcomes:
    """Resume session B with a cursor of session A (a confused client, proxy or cache)."""
    out = Outcomes()
    world = await _populate(store, sessions, 5)
    for a, b in zip(sessions[::2], sessions[1::2], strict=True):
        cursor = world.truth[(a, STREAM_NAMES[0])][2]
        key = (b, STREAM_NAMES[0])
        reply = await store.resume(b, cursor)
        classify(Attempt(key, None, len(world.truth[key]), reply), world.truth[key], out)
    return out


async def run_storm(url: str, sizes: Sizes) -> dict[str, Any]:
    """Run the storm and the two failure scenarios against both stores; return the report."""
    logging.getLogger("fastmcp").setLevel(logging.ERROR)  # "Event ID ... not found" per miss
    report: dict[str, Any] = {
        "sessions": sizes.storm_sessions,
        "concurrent_resumers": sizes.storm_tasks,
        "resumes_per_resumer": sizes.storm_ops_per_task,
        "writers": sizes.storm_writers,
        "writer_pause_s": sizes.storm_write_interval,
        "initial_events_per_stream": sizes.storm_initial_per_stream,
        "cursor_window": sizes.storm_window,
        "stores": {},
    }
    sessions = [f"s{i:04d}" for i in range(sizes.storm_sessions)]
    ev_sessions = [f"ev{i:04d}" for i in range(sizes.evicted_sessions)]
    fo_sessions = [f"fo{i:04d}" for i in range(2 * sizes.foreign_pairs)]
    seed = 20_251_202

    # -- replaystore (and the raw XRANGE baseline on its data) -------------
    r = client(url)
    try:
        async with (
            ReplayBuffer.from_url("redis://", client=r, prefix="storm:", max_events=10_000) as buf,
            ReplayBuffer.from_url(
                "redis://", client=r, prefix="storm-ev:", max_events=sizes.evicted_retention
            ) as small,
        ):
            store = ReplaystoreStore(buf)
            began = time.perf_counter()
            world = await _populate(store, sessions, sizes.storm_initial_per_stream)
            setup = time.perf_counter() - began

            async def raw_resume(session: str, cursor: str) -> Reply:
                # the sequence's own list, read natively from the cursor's ordinal on
                hint = Cursor.parse(cursor)
                key = f"storm:{{{session}}}:q:{hint.tag}"
                entries = await r.lrange(key, (hint.ordinal or 0) + 1, -1) or []
                return Reply([text(e.split(b":", 1)[0]) for e in entries], False, "raw", None)

            # Alternate replaystore and raw runs; the throughput is the median run.
            runs: list[Run] = []
            raw_runs: list[Run] = []
            for rep in range(sizes.storm_repeats):
                runs.append(await _storm(store, world, sizes, seed + rep))
                raw_runs.append(await _storm(store, world, sizes, seed + rep, raw_resume))
            report["stores"]["replaystore"] = _summary(runs, world, setup)
            raw = _throughput(raw_runs)
            raw["what"] = (
                "XRANGE (cursor + on the session's event stream, same picks, same writers: "
                "the cost of reading the data, with no judgement and no filtering by sequence"
            )
            report["stores"]["raw_xrange"] = raw
            small_store = ReplaystoreStore(small)
            report.setdefault("evicted", {})["replaystore"] = (
                await _evicted(small_store, ev_sessions, sizes.evicted_retention)
            ).as_dict()
            report.setdefault("foreign", {})["replaystore"] = (
                await _foreign(store, fo_sessions)
            ).as_dict()
    finally:
        await r.aclose()

    # -- FastMCP 4 EventStore over py-key-value RedisStore -----------------
    rf = client(url, decode=True)
    try:
        shared = EventStore(storage=RedisStore(client=rf))  # defaults: 100 per stream, ttl 3600
        fstore = FastMCPStore(shared)
        began = time.perf_counter()
        world = await _populate(fstore, sessions, sizes.storm_initial_per_stream)
        setup = time.perf_counter() - began
        # One run only: it is an order of magnitude slower than the others.
        report["stores"]["fastmcp"] = _summary(
            [await _storm(fstore, world, sizes, seed)], world, setup
        )
        small_shared = EventStore(
            storage=RedisStore(client=rf), max_events_per_stream=sizes.evicted_retention
        )
        report["evicted"]["fastmcp"] = (
            await _evicted(FastMCPStore(small_shared), ev_sessions, sizes.evicted_retention)
        ).as_dict()
        report["foreign"]["fastmcp"] = (await _foreign(fstore, fo_sessions)).as_dict()
    finally:
        await rf.aclose()

    stores = report["stores"]
    report["throughput_ratio_replaystore_vs_fastmcp"] = round(
        stores["replaystore"]["resumes_per_s"] / stores["fastmcp"]["resumes_per_s"], 2
    )
    report["throughput_ratio_replaystore_vs_raw_xrange"] = round(
        stores["replaystore"]["resumes_per_s"] / stores["raw_xrange"]["resumes_per_s"], 3
    )
    report["evicted_retention"] = {
        "replaystore_max_events_per_session": sizes.evicted_retention,
        "fastmcp_max_events_per_stream": sizes.evicted_retention,
        "events_per_stream": sizes.evicted_retention + EVICTED_EXTRA,
        "cursor": "the 3rd event of _GET_stream (evicted in both stores)",
    }
    return report


def _throughput(runs: list[Run]) -> dict[str, Any]:
    rates = [len(attempts) / elapsed for attempts, elapsed, _ in runs]
    best = sorted(range(len(runs)), key=lambda i: rates[i])[len(runs) // 2]
    attempts, elapsed, writes = runs[best]
    return {
        "runs": len(runs),
        "resumes_per_run": len(attempts),
        "resumes_per_s": round(rates[best], 1),
        "resumes_per_s_each_run": [round(x, 1) for x in rates],
        "seconds_median_run": round(elapsed, 3),
        "writes_during_median_run": writes,
        "writes_per_s_median_run": round(writes / elapsed, 1),
    }


def _summary(runs: list[Run], world: World, setup: float) -> dict[str, Any]:
    attempts = [a for run in runs for a in run[0]]
    outcomes = _judge(attempts, world.truth)
    return {
        "streams": len(world.streams),
        "events_at_end": sum(len(ids) for ids in world.truth.values()),
        "setup_seconds": round(setup, 2),
        **_throughput(runs),
        "mean_events_per_resume": round(outcomes.events_replayed / max(1, len(attempts)), 2),
        "outcomes": outcomes.as_dict(),
    }

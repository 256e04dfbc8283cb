"""Failover under load: writers and resumers on two processes while the replica is promoted behind.

Writers append to their sessions through one buffer (a server replica that
runs tools), resumers resolve random cursors through another (a replica a
client reconnects to). Replication lags, then the lagging replica is promoted
and the service address moved to it, cutting every connection. Each replay
is judged against what its writer was acknowledged: exact (every event after
the cursor that the writer was told is stored, in order, nothing foreign),
refused (any verdict but ``resumed``), or wrong. Wrong must be 0, with and
without ``wait_replicas``; no resume may take longer than 15 s.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from replaystore import (
    Event,
    ReplayBuffer,
    StorageError,
    StoreRegressedError,
    UnknownSessionError,
    Verdict,
)
from replaystore.testing import (
    ReplicatedPair,
    TcpProxy,
    redis_server_binary,
    start_replicated_pair,
)

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

SESSIONS = 6
RESUMERS = 4
LONGEST_RESUME_S = 15.0


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    with start_replicated_pair(redis_server_binary()) as started:
        yield started


@pytest.fixture
def service(pair: ReplicatedPair) -> Iterator[TcpProxy]:
    with TcpProxy([("127.0.0.1", pair.primary.ports[0])]) as proxy:
        yield proxy


@dataclass
class _Record:
    """What one session's writer attempted, in order: payload, id if acknowledged."""

    attempts: list[tuple[bytes, str | None]] = field(default_factory=list)
    ended: str | None = None  # why the writer stopped
    # Attempts on the replica when replication began to lag; resumers of the
    # "behind" sessions pick cursors only among those from then on (a client
    # whose cursor predates the loss: the case a stamp check cannot see).
    replicated: int | None = None
    behind: bool = False

    def acked(self) -> list[str]:
        return [eid for _, eid in self.attempts if eid is not None]


@dataclass
class _Tally:
    exact: int = 0
    refused: int = 0
    wrong: list[str] = field(default_factory=list)
    longest_s: float = 0.0


def _judge(record: _Record, cursor: str, events: list[Event]) -> str | None:
    """Why ``events`` replayed after ``cursor`` are wrong, or None.

    Every acknowledged attempt after the cursor must come, in order, up to
    the last event replayed; an unacknowledged one may come or not (it may
    be stored). A replay may end early (a read before later appends).
    """
    attempts = record.attempts
    at = next(i for i, (_, eid) in enumerate(attempts) if eid == cursor)
    j = at + 1
    for event in events:
        while j < len(attempts) and attempts[j][0] != event.payload:
            if attempts[j][1] is not None:
                return f"acknowledged {attempts[j][0]!r} skipped before {event.payload!r}"
            j += 1
        if j == len(attempts):
            return f"{event.payload!r} is no attempt after the cursor, in order"
        eid = attempts[j][1]
        if eid is not None and eid != event.event_id:
            return f"{event.payload!r} replayed as {event.event_id}, acknowledged as {eid}"
        j += 1
    return None


async def _storm(
    pair: ReplicatedPair, service: TcpProxy, prefix: str, wait_replicas: int = 0
) -> tuple[dict[str, _Record], _Tally]:
    records = {f"s{n}": _Record(behind=n % 2 == 0) for n in range(SESSIONS)}
    tally = _Tally()
    stop = asyncio.Event()
    rng = random.Random(7)
    # Judged once the writers stopped: a replay may hold an event whose append
    # has not returned to its writer yet.
    replays: list[tuple[str, str, list[Event]]] = []
    async with (
        ReplayBuffer.from_url(
            service.url(), prefix=prefix, wait_replicas=wait_replicas, wait_timeout=0.2
        ) as writers,
        ReplayBuffer.from_url(service.url(), prefix=prefix) as resumers,
    ):
        for session, record in records.items():
            for attempt in range(5):  # set-up: a replica slow to acknowledge on a busy machine
                try:
                    await writers.open_session(session)  # idempotent: sent again safely
                    break
                except StorageError:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.2)
            record.attempts.append((b"first", await resumers.append(session, "q", b"first")))

        async def write(session: str, record: _Record) -> None:
            n = 0
            while not stop.is_set() and record.ended is None:
                n += 1
                payload = f"{session}-{n}".encode()
                try:
                    eid: str | None = await writers.append(session, "q", payload)
                except (StoreRegressedError, UnknownSessionError) as exc:
                    record.ended = type(exc).__name__
                    eid = None
                except StorageError:
                    eid = None  # stored or not: not known to be durable
                record.attempts.append((payload, eid))
                await asyncio.sleep(0.005)

        async def resume() -> None:
            while not stop.is_set():
                session = rng.choice(list(records))
                record = records[session]
                if record.behind and record.replicated is not None:
                    acked = [eid for _, eid in record.attempts[: record.replicated] if eid]
                else:
                    acked = record.acked()
                cursor = rng.choice(acked[-20:])
                began = time.monotonic()
                try:
                    out = await resumers.resolve_and_replay(session, cursor)
                except StorageError:
                    tally.refused += 1
                    continue
                finally:
                    tally.longest_s = max(tally.longest_s, time.monotonic() - began)
                if out.verdict is not Verdict.RESUMED:
                    tally.refused += 1
                    continue
                replays.append((session, cursor, out.events))
                await asyncio.sleep(0.002)

        async with asyncio.TaskGroup() as tasks:
            for session, record in records.items():
                tasks.create_task(write(session, record))
            for _ in range(RESUMERS):
                tasks.create_task(resume())
            await asyncio.sleep(0.5)
            await asyncio.to_thread(pair.wait_in_sync)
            for record in records.values():
                record.replicated = len(record.attempts)
            pair.lag()
            await asyncio.sleep(0.6)
            pair.promote()
            service.set_upstreams([("127.0.0.1", pair.replica.ports[0])])
            await asyncio.to_thread(service.sever_all)
            await asyncio.sleep(1.5)
            stop.set()
    for session, cursor, events in replays:
        why = _judge(records[session], cursor, events)
        if why is None:
            tally.exact += 1
        else:
            tally.wrong.append(f"{session} from {cursor}: {why}")
    return records, tally


async def _ended_sessions(url: str, prefix: str, records: dict[str, _Record]) -> dict[str, str]:
    """Each session's state read afresh: ``live``, or the verdict that ended it."""
    states: dict[str, str] = {}
    async with ReplayBuffer.from_url(url, prefix=prefix) as fresh:
        for session, record in records.items():
            out = await fresh.resolve_and_replay(session, record.acked()[0])
            tomb = out.evidence.tombstone
            if out.verdict is Verdict.UNKNOWN_SESSION and tomb is not None:
                states[session] = str(tomb.verdict.value if tomb.verdict else tomb.reason)
            else:
                states[session] = "live" if out.verdict is Verdict.RESUMED else out.verdict.value
    return states


async def test_without_wait_replicas_lost_appends_end_their_sessions(
    pair: ReplicatedPair, service: TcpProxy, prefix: str
) -> None:
    records, tally = await _storm(pair, service, prefix)
    assert tally.wrong == [], tally.wrong[:5]
    assert tally.exact > 50, tally
    assert tally.longest_s < LONGEST_RESUME_S, tally
    # Appends were lost (replication lagged 0.6 s under writes): every session
    # ended, and its writer was told (by the regression it met, or by the
    # session already ended, by the check after the cut or by a resume).
    assert all(r.ended in ("StoreRegressedError", "UnknownSessionError") for r in records.values())
    states = await _ended_sessions(service.url(), prefix, records)
    # A "behind" session is resumed only from cursors that survived: no
    # failed verdict can have ended it, only the regression its writer saw.
    behind = {s for s, r in records.items() if r.behind}
    assert {s for s in behind if states[s] == "store_regressed"} == behind, states
    assert "live" not in states.values(), states


async def test_with_wait_replicas_nothing_acknowledged_is_lost(
    pair: ReplicatedPair, service: TcpProxy, prefix: str
) -> None:
    records, tally = await _storm(pair, service, prefix, wait_replicas=1)
    assert tally.wrong == [], tally.wrong[:5]
    assert tally.exact > 50, tally
    assert tally.longest_s < LONGEST_RESUME_S, tally
    # Nothing a writer was told is stored went missing: no session regressed.
    assert all(r.ended is None for r in records.values()), {s: r.ended for s, r in records.items()}
    states = await _ended_sessions(service.url(), prefix, records)
    assert set(states.values()) == {"live"}, states
    for session, record in records.items():
        async with ReplayBuffer.from_url(service.url(), prefix=prefix) as fresh:
            out = await fresh.resolve_and_replay(session, record.acked()[0])
        assert _judge(record, record.acked()[0], out.events) is None, session
        replayed = {e.event_id for e in out.events}
        assert set(record.acked()[1:]) <= replayed, session

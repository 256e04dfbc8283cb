"""A storm of concurrent callers in one process: slower, never wrong, never a local failure.

About 500 callers at once (a writer per session and resumers over 300
sessions) share one buffer. The cluster client must wait for a connection
the way the standalone client's blocking pool does (redis-py's async cluster
client alone raises ``MaxConnectionsError`` past 100 connections per node),
and every resume must be exact while the writers keep appending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from replaystore import ReplayBuffer, StorageError, Verdict
from replaystore.testing.servers import (
    ServerHandle,
    redis_server_binary,
    start_sentinel,
    start_standalone,
)
from tests.faults.conftest import at
from tests.plugins.servers import RealServers

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

SESSIONS = 300
RESUMERS = 200
EVENTS = 5  # per session: one before the storm, the rest during it
RESUMES = 3  # per resumer


@dataclass
class _Ledger:
    """What the writers have been told is stored, per session (their acknowledged appends)."""

    epochs: dict[str, str] = field(default_factory=dict)
    first: dict[str, str] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)


def _payload(session: str, i: int) -> bytes:
    return f"{session}/{i}".encode()


async def _writer(buf: ReplayBuffer, session: str, ledger: _Ledger) -> None:
    for i in range(1, EVENTS):
        eid = await buf.append(session, "w", _payload(session, i))
        if at(eid) != (ledger.epochs[session], i + 1):
            ledger.wrong.append(f"{session}: append {i} got id {eid}")
        ledger.acked[session] = i + 1


async def _resumer(buf: ReplayBuffer, session: str, ledger: _Ledger) -> None:
    """Resume from the first event, again and again, while the writer appends."""
    first = ledger.first[session]
    for _ in range(RESUMES):
        acked = ledger.acked[session]
        res = await buf.resolve_and_replay(session, first)
        if res.verdict is not Verdict.RESUMED:
            ledger.wrong.append(f"{session}: {res.verdict} {res.evidence.as_dict()}")
            return
        got = [e.payload for e in res.events]
        want = [_payload(session, i) for i in range(1, 1 + len(got))]
        # Exactly the next events in order, and at least every acknowledged one.
        if got != want or len(got) + 1 < acked:
            ledger.wrong.append(f"{session}: replayed {got} with {acked} acknowledged")
        await asyncio.sleep(0)


async def _guard(coro: Coroutine[Any, Any, None], ledger: _Ledger) -> None:
    try:
        await coro
    except StorageError as exc:
        ledger.failures.append(exc)


async def _storm(url: str, prefix: str) -> None:
    async with ReplayBuffer.from_url(url, prefix=prefix) as buf:
        sessions = [f"storm-{i}" for i in range(SESSIONS)]
        ledger = _Ledger()
        infos = await asyncio.gather(*(buf.open_session(s) for s in sessions))
        ledger.epochs = {info.session: info.epoch for info in infos}
        firsts = await asyncio.gather(*(buf.append(s, "w", _payload(s, 0)) for s in sessions))
        ledger.first = dict(zip(sessions, firsts, strict=True))
        ledger.acked = dict.fromkeys(sessions, 1)

        callers = [_writer(buf, s, ledger) for s in sessions]
        callers += [_resumer(buf, sessions[i % SESSIONS], ledger) for i in range(RESUMERS)]
        assert len(callers) >= 500
        await asyncio.gather(*(_guard(c, ledger) for c in callers))

        assert ledger.failures == [], f"{len(ledger.failures)} StorageErrors: {ledger.failures[:3]}"
        assert ledger.wrong == [], ledger.wrong[:5]
        # After the storm, every session holds exactly what its writer was told.
        finals = await asyncio.gather(
            *(
                buf.resolve_and_replay(s, str(info.origin))
                for s, info in zip(sessions, infos, strict=True)
            )
        )
        for session, res in zip(sessions, finals, strict=True):
            assert res.verdict is Verdict.RESUMED, (session, res)
            assert [e.payload for e in res.events] == [_payload(session, i) for i in range(EVENTS)]


@pytest.fixture(scope="module")
def sentinel() -> Iterator[ServerHandle]:
    """A master watched by one sentinel; the handle is the sentinel's (its URL names the master)."""
    master = start_standalone(redis_server_binary())
    try:
        watcher = start_sentinel(redis_server_binary(), master.ports[0], "storm")
        yield watcher
        watcher.stop()
    finally:
        master.stop()


def _url(kind: str, real_servers: RealServers, sentinel: ServerHandle) -> str:
    return sentinel.url if kind == "sentinel" else real_servers.shared(kind).url


@pytest.mark.parametrize(
    ("kind", "query"),
    [
        ("cluster", ""),
        # A pool far below the number of callers: almost every call waits.
        ("cluster", "?max_connections=4&pool_timeout=60"),
        ("redis", ""),
        ("sentinel", "?max_connections=4&pool_timeout=60"),
    ],
    ids=["cluster", "cluster-tight-pool", "standalone", "sentinel-tight-pool"],
)
async def test_storm_of_concurrent_callers_stays_exact(
    real_servers: RealServers,
    sentinel: ServerHandle,
    prefix: str,
    kind: str,
    query: str,
) -> None:
    await _storm(_url(kind, real_servers, sentinel) + query, prefix)


@pytest.mark.parametrize("kind", ["cluster", "redis", "sentinel"])
async def test_pool_timeout_expires_as_storage_error(
    real_servers: RealServers, sentinel: ServerHandle, prefix: str, kind: str
) -> None:
    """No free connection within ``pool_timeout``: StorageError, and the buffer recovers."""
    url = _url(kind, real_servers, sentinel) + "?max_connections=1&pool_timeout=0.2"
    async with ReplayBuffer.from_url(url, prefix=prefix) as buf:
        await buf.open_session("held")
        client = buf.backend.client  # type: ignore[attr-defined]
        # The one connection is busy for a second with a blocking pop.
        blocker = asyncio.create_task(client.execute_command("BLPOP", f"{prefix}idle", 1))
        await _until_blocked(client)
        with pytest.raises(StorageError):
            await buf.append("held", "w", b"x")
        assert await blocker is None
        await buf.append("held", "w", b"y")
        info = await buf.session_info("held")
        assert info is not None
        res = await buf.resolve_and_replay("held", str(info.origin))
        assert [e.payload for e in res.events] == [b"y"], "the timed-out append stored nothing"


async def _until_blocked(client: Any) -> None:
    """Wait until Redis reports the blocking pop (asked over connections of our own)."""
    if isinstance(client, RedisCluster):
        ports = [node.port for node in client.get_primaries()]
    elif isinstance(client.connection_pool, SentinelConnectionPool):
        ports = [int((await client.connection_pool.get_master_address())[1])]
    else:
        ports = [client.connection_pool.connection_kwargs["port"]]
    for _ in range(500):
        blocked = 0
        for port in ports:
            async with aioredis.Redis(port=port) as node:
                blocked += int((await node.info("clients"))["blocked_clients"])
        if blocked:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the blocking pop never reached Redis")

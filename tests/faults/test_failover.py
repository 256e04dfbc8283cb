"""Failover with replication lag: a real primary and replica, the replica promoted while behind.

The client reaches Redis through a ``TcpProxy`` standing for the service
address (a virtual IP, a DNS name); the failover points that address at the
promoted replica and cuts the open connections, as a real one would. Events
the old primary acknowledged but never replicated are gone: a cursor at one
of them must get a failure verdict, never a resume into whatever the new
primary writes at those positions. With the durability option, an append
that returned is on the replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from replaystore import ReplayBuffer, StorageError, UnsupportedURLError, Verdict
from replaystore.testing import (
    ReplicatedPair,
    TcpProxy,
    redis_server_binary,
    start_replicated_pair,
)
from tests.faults.conftest import at

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

DURABLE = {"wait_replicas": 1, "wait_timeout": 0.5}
"""The opt-in durability option: an append returns once a replica acknowledged it."""


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    with start_replicated_pair(redis_server_binary()) as started:
        yield started


@pytest.fixture
def service(pair: ReplicatedPair) -> Iterator[TcpProxy]:
    """The address clients use: the primary now, the promoted replica after ``_fail_over``."""
    with TcpProxy([("127.0.0.1", pair.primary.ports[0])]) as proxy:
        yield proxy


def _fail_over(pair: ReplicatedPair, service: TcpProxy) -> None:
    """Promote the replica and move the service address to it (run off the event loop: the
    pool sees its connections close, as it would during any real failover)."""
    pair.promote()
    service.set_upstreams([("127.0.0.1", pair.replica.ports[0])])
    service.sever_all()


async def _durable_buffer(url: str, prefix: str) -> ReplayBuffer:
    try:
        buf = ReplayBuffer.from_url(url, prefix=prefix, **DURABLE)
        return await buf.__aenter__()
    except (TypeError, UnsupportedURLError) as exc:
        pytest.fail(f"the durability option {DURABLE} is not accepted: {exc}")


def test_the_pair_lags_catches_up_and_loses_what_is_held_at_promotion(
    pair: ReplicatedPair,
) -> None:
    primary = redis.Redis(port=pair.primary.ports[0])
    replica = redis.Redis(port=pair.replica.ports[0])
    try:
        primary.set("k1", "1")
        pair.wait_in_sync()
        assert replica.get("k1") == b"1"
        pair.lag()
        primary.set("k2", "2")
        assert primary.wait(1, 200) == 0, "a lagging replica cannot acknowledge"
        assert replica.get("k2") is None
        pair.catch_up()
        pair.wait_in_sync()
        assert replica.get("k2") == b"2"
        pair.lag()
        primary.set("k3", "3")
        pair.promote()
        assert replica.get("k3") is None
        assert replica.set("k4", "4") is True, "the promoted replica takes writes"
        assert primary.get("k3") == b"3"
    finally:
        primary.close()
        replica.close()


async def test_lost_events_are_never_resumed_into_new_data(
    pair: ReplicatedPair, service: TcpProxy, prefix: str
) -> None:
    async with ReplayBuffer.from_url(service.url(), prefix=prefix) as buf:
        info = await buf.open_session("s")
        kept = await buf.append_many("s", "q", [b"e1", b"e2", b"e3"])
        await _replicated(pair)
        pair.lag()
        lost = await buf.append_many("s", "q", [b"e4", b"e5"])  # acknowledged, never replicated
        assert [at(eid) for eid in lost] == [(info.epoch, 4), (info.epoch, 5)]

        await asyncio.to_thread(_fail_over, pair, service)

        for cursor in lost:
            probe = await buf.resolve("s", cursor)
            assert probe.verdict is not Verdict.RESUMED, (cursor, probe)
        # What survived resumes exactly.
        replay = await buf.resolve_and_replay("s", kept[0])
        assert replay.verdict is Verdict.RESUMED, replay
        assert [e.payload for e in replay.events] == [b"e2", b"e3"]

        # The new primary goes on writing: never under an id a client may hold.
        fresh = await buf.append_many("s", "q", [b"n1", b"n2", b"n3"])
        assert not set(fresh) & set(lost), f"ids {lost} handed out again: {fresh}"
        for cursor in lost:
            probe = await buf.resolve("s", cursor)
            assert probe.verdict is not Verdict.RESUMED, (cursor, probe)
        # A cursor from before the loss resumes exactly what is there, or fails: never a gap.
        after = await buf.resolve_and_replay("s", kept[2])
        if after.verdict is Verdict.RESUMED:
            assert [e.payload for e in after.events] == [b"n1", b"n2", b"n3"]
        else:
            assert after.events == []


async def test_durable_appends_survive_the_failover(
    pair: ReplicatedPair, service: TcpProxy, prefix: str
) -> None:
    async with await _durable_buffer(service.url(), prefix) as buf:
        info = await buf.open_session("s")
        # No wait for the replica here: the option is what makes these durable.
        acked = [await buf.append("s", "q", f"e{i}".encode()) for i in range(1, 4)]
        acked += await buf.append_many("s", "q", [b"e4", None])
        pair.lag()
        with pytest.raises(StorageError):
            await buf.append("s", "q", b"unacknowledged")
        # The old primary holds it: a live tail there may have delivered its id.
        async with ReplayBuffer.from_url(
            pair.primary.url, prefix=prefix, teardown_on_failure=False
        ) as old:
            seen = (await old.resolve_and_replay("s", acked[-1])).events
        assert [e.payload for e in seen] == [b"unacknowledged"]
        unacked = seen[0].event_id
        assert at(unacked) == (info.epoch, 6)

        await asyncio.to_thread(_fail_over, pair, service)

        replay = await buf.resolve_and_replay("s", str(info.origin))
        assert replay.verdict is Verdict.RESUMED, replay
        assert [e.event_id for e in replay.events] == acked
        assert [e.payload for e in replay.events] == [b"e1", b"e2", b"e3", b"e4", None]
        # A client that saw the unacknowledged event must not resume into other data.
        probe = await buf.resolve("s", unacked)
        assert probe.verdict is not Verdict.RESUMED, probe
        # The new primary has no replica yet: a durable append is refused...
        with pytest.raises(StorageError):
            await buf.append("s", "q", b"n1")
        # ...and nothing written after the failover makes the lost event's id resumable.
        async with ReplayBuffer.from_url(service.url(), prefix=prefix) as plain:
            fresh = await plain.append("s", "q", b"n2")
            assert fresh != unacked
            probe = await plain.resolve("s", unacked)
            assert probe.verdict is not Verdict.RESUMED, probe


async def _replicated(pair: ReplicatedPair) -> None:
    """Wait (off the event loop) until the replica has every write so far."""
    await asyncio.to_thread(pair.wait_in_sync)

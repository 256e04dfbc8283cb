"""Failover with replication lag: a real primary and replica, the replica promoted while behind.

The client reaches Redis through a ``TcpProxy`` standing for the service
address (a virtual IP, a DNS name); the failover points that address at the
promoted replica and cuts the open connections, as a real one would. Events
the old primary acknowledged but never replicated are gone: the process
that was handed their positions ends the session (``store_regressed``)
rather than let the new primary issue them again, so no resume replays a
chain with a gap in it. With the durability option, an append that returned
is on the replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from replaystore import (
    ReplayBuffer,
    Resumption,
    StorageError,
    StoreRegressedError,
    UnknownSessionError,
    UnsupportedURLError,
    Verdict,
)
from replaystore.backends.redis import RedisBackend
from replaystore.testing import (
    ReplicatedPair,
    TcpProxy,
    redis_server_binary,
    start_replicated_pair,
)
from tests.faults.conftest import at

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

DURABLE = {"wait_replicas": 1, "wait_timeout": 2.0}
"""The opt-in durability option: an append returns once a replica acknowledged it (a loaded
machine may take more than half a second for the first write after the pair synced)."""


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


async def _lose_two(
    pair: ReplicatedPair, service: TcpProxy, writer: ReplayBuffer
) -> tuple[list[str], list[str]]:
    """e1..e3 replicated, e4 and e5 acknowledged and never replicated, then the failover."""
    info = await writer.open_session("s")
    kept = await writer.append_many("s", "q", [b"e1", b"e2", b"e3"])
    await _replicated(pair)
    pair.lag()
    lost = await writer.append_many("s", "q", [b"e4", b"e5"])
    assert [at(eid) for eid in lost] == [(info.epoch, 4), (info.epoch, 5)]
    await asyncio.to_thread(_fail_over, pair, service)
    return kept, lost


def _ended_by_the_loss(out: Resumption) -> None:
    assert out.verdict is Verdict.UNKNOWN_SESSION and out.events == [], out
    assert out.evidence.tombstone is not None, out
    assert out.evidence.tombstone.verdict is Verdict.STORE_REGRESSED, out


async def test_the_writer_refuses_to_reuse_lost_positions_and_ends_the_session(
    pair: ReplicatedPair, service: TcpProxy, prefix: str
) -> None:
    async with (
        ReplayBuffer.from_url(service.url(), prefix=prefix) as writer,
        ReplayBuffer.from_url(service.url(), prefix=prefix) as other,
    ):
        kept, lost = await _lose_two(pair, service, writer)
        # Another process, handed none of the lost positions, reads what survived:
        # exact so far (nothing has been written at the lost positions).
        replay = await other.resolve_and_replay("s", kept[0])
        assert replay.verdict is Verdict.RESUMED, replay
        assert [e.payload for e in replay.events] == [b"e2", b"e3"]
        # The process that was handed 4 and 5 sees the store behind it: nothing
        # is stored at those positions again, and the session ends for everyone.
        with pytest.raises(StoreRegressedError):
            await writer.append("s", "q", b"n1")
        for cursor in [*kept, *lost]:
            _ended_by_the_loss(await other.resolve_and_replay("s", cursor))
            _ended_by_the_loss(await writer.resolve_and_replay("s", cursor))
        with pytest.raises(UnknownSessionError):
            await other.append("s", "q", b"n2")


async def test_a_resume_on_the_writer_is_refused_with_store_regressed(
    pair: ReplicatedPair, service: TcpProxy, prefix: str
) -> None:
    async with (
        ReplayBuffer.from_url(service.url(), prefix=prefix) as writer,
        ReplayBuffer.from_url(service.url(), prefix=prefix) as other,
    ):
        kept, lost = await _lose_two(pair, service, writer)
        # Whether the writer ends the session before it is asked depends on
        # whether its pooled connection was found cut first (it then checks
        # its fences on its next call, which ends every session behind one):
        # either way, the loss is what each answer names.
        for cursor in lost:  # a probe judges without ending anything
            probe = await writer.resolve("s", cursor)
            if probe.verdict is not Verdict.STORE_REGRESSED:
                _ended_by_the_loss(probe)
        out = await writer.resolve_and_replay("s", kept[0])
        if out.verdict is Verdict.STORE_REGRESSED:
            assert out.events == [] and out.evidence.torn_down, out
        else:
            _ended_by_the_loss(out)
        _ended_by_the_loss(await other.resolve_and_replay("s", kept[0]))


async def test_after_a_lost_connection_every_session_behind_its_fence_ends(
    pair: ReplicatedPair, service: TcpProxy, prefix: str
) -> None:
    """A session its writer never touches again (its last events were lost) still ends."""
    async with (
        ReplayBuffer.from_url(service.url(), prefix=prefix) as writer,
        ReplayBuffer.from_url(service.url(), prefix=prefix) as other,
    ):
        whole = await writer.open_session("whole")
        await writer.append("whole", "q", b"w1")
        kept, _ = await _lose_two(pair, service, writer)
        assert isinstance(writer.backend, RedisBackend)
        try:
            ended = await writer.backend.check_fences()
        except StorageError:  # a pooled connection the move cut: the next call checks again
            ended = await writer.backend.check_fences()
        assert ended == ["s"]
        _ended_by_the_loss(await other.resolve_and_replay("s", kept[0]))
        survivor = await other.resolve_and_replay("whole", str(whole.origin))
        assert survivor.verdict is Verdict.RESUMED, survivor
        assert [e.payload for e in survivor.events] == [b"w1"]


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

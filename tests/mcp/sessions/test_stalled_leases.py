"""A lease written as the store stalls lands after its request was refused: who may take it over.

In-process (no HTTP): two session managers on one real Redis are two
replicas; the first reaches Redis through a TCP proxy that is paused while
it takes a request's lease, as the POST path does (bounded by the store
timeout, then answered 503). The lease write, queued in the proxy, lands
once it resumes: a lease naming the first replica on a request that never
ran. Only the first replica, which knows it refused the request, takes it
over for a copy sent again; never another replica, never two copies, never
a request that ran here or whose stream is stored.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import pytest
from mcp.server.lowlevel.server import Server

from replaystore import ReplayBuffer
from replaystore.errors import StorageError
from replaystore.mcp import ReplayEventStore
from replaystore.mcp.refusals import bounded
from replaystore.mcp.sessions.event_store import SessionView
from replaystore.mcp.sessions.leases import Lease, give_back, take_lease
from replaystore.mcp.sessions.manager import ReplaySessionManager
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle

pytestmark = pytest.mark.anyio


@dataclass
class Replicas:
    proxy: TcpProxy
    stalling: SessionView  # the first replica's view of the session, through the proxy
    other: SessionView  # the second replica's, straight to Redis

    async def refused(self, stream: str) -> None:
        """Take the lease while the store stalls, as a POST answered 503 does; it lands late."""
        self.proxy.pause()
        try:
            with pytest.raises(StorageError), bounded(0.3):
                await take_lease(self.stalling, stream)
        finally:
            self.proxy.resume()
        replica = self.stalling.replica
        assert replica is not None
        with anyio.fail_after(5):
            session = self.stalling.session_id
            while await replica.registry.owner(session, stream) != replica.id:  # noqa: ASYNC110
                await anyio.sleep(0.02)


@pytest.fixture
async def replicas(mcp_redis: ServerHandle) -> AsyncIterator[Replicas]:
    redis = ("127.0.0.1", mcp_redis.ports[0])
    prefix = f"?prefix=stalled-{uuid.uuid4().hex[:8]}:"
    with TcpProxy([redis]) as proxy:
        stalling_buffer = ReplayBuffer.from_url(proxy.url() + prefix)
        other_buffer = ReplayBuffer.from_url(f"redis://{redis[0]}:{redis[1]}/0{prefix}")
        stalling_store = ReplayEventStore(stalling_buffer)
        other_store = ReplayEventStore(other_buffer)
        first = ReplaySessionManager(Server("first"), stalling_store)
        second = ReplaySessionManager(Server("second"), other_store)
        stalling = stalling_store.for_session("S", first.replica)
        await stalling.open()
        other = other_store.for_session("S", second.replica)
        try:
            yield Replicas(proxy, stalling, other)
        finally:
            await stalling_buffer.aclose()
            await other_buffer.aclose()


async def test_the_copy_sent_again_to_the_replica_that_refused_it_runs_once(
    replicas: Replicas,
) -> None:
    await replicas.refused("7")
    # Another replica cannot tell the late lease from a request running there.
    assert await take_lease(replicas.other, "7") is Lease.RECEIVED
    # The replica that refused it takes it over, for one copy only.
    assert await take_lease(replicas.stalling, "7") is Lease.TAKEN
    assert await take_lease(replicas.stalling, "7") is Lease.RECEIVED
    assert await take_lease(replicas.other, "7") is Lease.RECEIVED


async def test_two_copies_at_once_on_the_refusing_replica_run_once(replicas: Replicas) -> None:
    await replicas.refused("8")
    found: list[Lease] = []

    async def copy() -> None:
        found.append(await take_lease(replicas.stalling, "8"))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(copy)
    assert sorted(lease.value for lease in found) == ["received", "received", "taken"]


async def test_a_refused_request_whose_first_event_landed_too_is_not_taken_over(
    replicas: Replicas,
) -> None:
    await replicas.refused("9")
    await replicas.other.append("9", None)  # its priming event, stored late as well
    assert await take_lease(replicas.stalling, "9") is Lease.RECEIVED
    replica = replicas.stalling.replica
    assert replica is not None and replica.leases_held == 0


async def test_a_request_stopped_here_while_it_ran_is_never_taken_over(
    replicas: Replicas,
) -> None:
    replica = replicas.stalling.replica
    assert replica is not None
    assert await take_lease(replicas.stalling, "10") is Lease.TAKEN  # it runs here
    replica.release_session("S")  # stopped (its session dropped here); the drop not sent
    await replicas.refused("10")  # a copy refused meanwhile: the lease is still the run's
    assert await take_lease(replicas.stalling, "10") is Lease.RECEIVED


async def test_a_request_given_back_here_is_never_taken_over(replicas: Replicas) -> None:
    """A lease given back here may have its drop land late, on whatever lease is there then."""
    assert await take_lease(replicas.stalling, "11") is Lease.TAKEN
    await give_back(replicas.stalling, "11")  # not run after all (a 503 as its event was stored)
    await replicas.refused("11")  # a copy refused as the store stalled: its lease lands late
    assert await take_lease(replicas.stalling, "11") is Lease.RECEIVED

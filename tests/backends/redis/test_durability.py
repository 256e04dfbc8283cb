"""Retries after a dropped connection, and the opt-in replica acknowledgement (``WAIT``)."""

from __future__ import annotations

import anyio
import pytest
import redis.asyncio as aioredis

from replaystore import ReplayBuffer, StorageError, UnsupportedURLError, Verdict
from replaystore.testing.servers import ServerHandle, redis_server_binary, start_standalone

from ._support import client_of

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]


async def _kill_connections(admin: aioredis.Redis, buf: ReplayBuffer) -> None:
    """Close the buffer's pooled connections from the server side (what a restart does)."""
    me = int(await client_of(buf).client_id())
    for entry in await admin.client_list():
        if int(entry["id"]) != int(await admin.client_id()):
            await admin.client_kill_filter(_id=entry["id"])
    assert me  # the buffer had a connection to lose


async def test_idempotent_calls_survive_a_dropped_connection(
    own_server: ServerHandle, prefix: str
) -> None:
    admin = aioredis.Redis.from_url(own_server.url)
    try:
        async with ReplayBuffer.from_url(own_server.url, prefix=prefix) as buf:
            await buf.open_session("s")
            ids = [await buf.append("s", "q", b"1", idempotency_key="a")]
            calls = [
                lambda: buf.open_session("s"),
                lambda: buf.session_info("s"),
                lambda: buf.resolve("s", ids[0]),
                lambda: buf.resolve_and_replay("s", ids[0]),
                lambda: buf.append("s", "q", b"2", idempotency_key="b"),
            ]
            for call in calls:
                await _kill_connections(admin, buf)
                await call()  # no StorageError: retried once on a fresh connection
            # (an append without a key is never retried: the lost-reply fault test
            # under tests/faults/ cuts the reply with a proxy to prove it)
            replay = await buf.resolve_and_replay("s", ids[0])
            assert [e.payload for e in replay.events] == [b"2"]
            await _kill_connections(admin, buf)
            assert await buf.close_session("s") is True
    finally:
        await admin.aclose()


async def test_wait_replicas_needs_an_acknowledgement(redis_server: ServerHandle, prefix: str):
    url = f"{redis_server.url}?prefix={prefix}&wait_replicas=1&wait_timeout=0.2"
    async with ReplayBuffer.from_url(url) as buf:
        assert buf.backend.wait_replicas == 1  # type: ignore[attr-defined]
        # a session is durable once opened, as its events once appended
        with anyio.fail_after(5), pytest.raises(StorageError, match="acknowledged by 0 of 1"):
            await buf.open_session("s")
        with anyio.fail_after(5), pytest.raises(StorageError, match="acknowledged by 0 of 1") as e:
            await buf.append("s", "q", b"x")
        assert e.value.kind == "unreplicated" and not e.value.permanent
        # a retry finds the event stored and still refuses: it is no more durable
        with anyio.fail_after(5), pytest.raises(StorageError, match="acknowledged by 0 of 1"):
            await buf.append_many("s", "q", [b"y"], idempotency_key="k")
        with anyio.fail_after(5), pytest.raises(StorageError, match="acknowledged by 0 of 1"):
            await buf.append_many("s", "q", [b"y"], idempotency_key="k")
        # the events are stored on the primary all the same: the caller was told
        # they are not known to be durable, not that they are absent
        info = await buf.session_info("s")
        assert info is not None and info.high_water == 2
    with pytest.raises(UnsupportedURLError):
        ReplayBuffer.from_url(f"{redis_server.url}?wait_replicas=x")


async def test_wait_longer_than_the_socket_timeout_still_gets_its_answer(
    redis_server: ServerHandle, prefix: str
) -> None:
    """``WAIT`` blocks in Redis for up to ``wait_timeout``: a socket timeout
    shorter than that must not cut it off as a dead connection."""
    url = f"{redis_server.url}?prefix={prefix}&wait_replicas=1&wait_timeout=0.6&socket_timeout=0.3"
    async with ReplayBuffer.from_url(url) as buf:
        with anyio.fail_after(5), pytest.raises(StorageError, match="acknowledged by 0 of 1"):
            await buf.open_session("s")
        with anyio.fail_after(5), pytest.raises(StorageError, match="acknowledged by 0 of 1"):
            await buf.append("s", "q", b"x")


async def test_wait_replicas_with_a_real_replica(prefix: str) -> None:
    primary = start_standalone(redis_server_binary(), "redis")
    replica = start_standalone(redis_server_binary(), "redis")
    try:
        follower = aioredis.Redis.from_url(replica.url)
        await follower.replicaof("127.0.0.1", primary.ports[0])
        with anyio.fail_after(10):
            while (await follower.info("replication")).get("master_link_status") != "up":  # noqa: ASYNC110
                await anyio.sleep(0.05)
        async with ReplayBuffer.from_url(
            primary.url, prefix=prefix, wait_replicas=1, wait_timeout=2.0
        ) as buf:
            await buf.open_session("s")
            ids = await buf.append_many("s", "q", [b"1", b"2"])
            ids.append(await buf.append("s", "q", b"3", idempotency_key="k"))
        # what returned is on the replica already
        async with ReplayBuffer.from_url(replica.url, prefix=prefix) as reader:
            res = await reader.resolve("s", ids[0])
            assert res.verdict is Verdict.RESUMED
            assert res.evidence.high_water == 3
        await follower.aclose()
    finally:
        replica.stop()
        primary.stop()

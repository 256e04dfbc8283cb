"""The teardown of a failure the fast read decided: an optimistic transaction, and its fallbacks.

Each test steps into the two packets of the transaction (``Wire.watched``) to
make what a concurrent replica could do happen at the worst moment: a change
of the session between the read and ``EXEC``, a teardown by someone else
before the read, a reply lost after ``EXEC`` ran.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from replaystore import ReplayBuffer, Verdict
from replaystore.testing.servers import ServerHandle

from ._support import command_calls

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]


def _ahead(event_id: str) -> str:
    """The same cursor, its position moved past anything the session issued."""
    position = event_id.split("-")[1].split(".")[0]
    return event_id.replace(f"-{position}.", "-99.", 1)


async def _session(buf: ReplayBuffer, name: str) -> list[str]:
    await buf.open_session(name)
    return [await buf.append(name, s, b"x") for s in ("q", "r")]


async def test_a_change_before_exec_sends_the_resume_to_the_script(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """The meta hash changes between the transaction's read and its ``EXEC``
    (another replica appended): ``EXEC`` runs nothing, and the facts script
    judges the resume again on the new state and tears it down itself."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    meddler = redis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
            ids = await _session(buf, "s")
            meta = buf.backend.key_base("s") + ":m"  # type: ignore[attr-defined]
            wire: Any = buf.backend._wire  # type: ignore[attr-defined]
            watched = wire.watched

            async def meddling(reads: bytes, replies: int, then: Any) -> Any:
                def late(first: list[Any]) -> tuple[bytes, int]:
                    meddler.hset(meta, "gc", 0)  # a write to the watched hash
                    return then(first)  # type: ignore[no-any-return]

                return await watched(reads, replies, late)

            wire.watched = meddling
            await admin.config_resetstat()
            res = await buf.resolve_and_replay("s", _ahead(ids[0]))
            assert res.verdict is Verdict.AHEAD_OF_HIGH_WATER, res
            assert res.evidence.torn_down
            stats = await command_calls(admin)
            # The transaction was tried and ran nothing; the script tore down.
            assert stats["exec"] == 1 and stats["fcall"] >= 1, stats
            again = await buf.resolve_and_replay("s", ids[0])
            assert again.verdict is Verdict.UNKNOWN_SESSION
            assert again.evidence.tombstone is not None
            assert again.evidence.tombstone.verdict is Verdict.AHEAD_OF_HIGH_WATER
    finally:
        meddler.close()
        await admin.aclose()


async def test_a_session_gone_before_the_read_ends_the_watch_and_names_its_tombstone(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """Another replica closed the session after the fast read: the
    transaction's read finds it gone, ends its ``WATCH`` (the connection goes
    back to the pool clean) and the script path names the tombstone."""
    pool = aioredis.ConnectionPool.from_url(scratch_server.url, max_connections=1)
    client = aioredis.Redis(connection_pool=pool)
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with (
            ReplayBuffer.from_url(scratch_server.url, client=client, prefix=prefix) as buf,
            ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as other,
        ):
            ids = await _session(buf, "s")
            base = buf.backend.key_base("s")  # type: ignore[attr-defined]
            wire: Any = buf.backend._wire  # type: ignore[attr-defined]
            watched = wire.watched

            async def closed_first(reads: bytes, replies: int, then: Any) -> Any:
                assert await other.close_session("s")
                return await watched(reads, replies, then)

            wire.watched = closed_first
            res = await buf.resolve_and_replay("s", _ahead(ids[0]))
            assert res.verdict is Verdict.UNKNOWN_SESSION, res
            assert res.evidence.tombstone is not None
            assert res.evidence.tombstone.verdict is None  # closed, not failed
            # The one pooled connection holds no WATCH: a write to the key it
            # watched does not abort the next transaction on it.
            await admin.set(f"{base}:m", b"x")
            async with client.pipeline(transaction=True) as pipe:
                pipe.ping()
                assert await pipe.execute() == [True]
    finally:
        await admin.aclose()
        await client.aclose()


async def test_a_lost_reply_after_exec_is_recognised_by_its_nonce(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """``EXEC`` ran but its reply was lost: the call is sent again, finds the
    session gone with its own tombstone (by the nonce in it) and answers the
    verdict it tore down with, not "unknown session"."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
            ids = await _session(buf, "s")
            wire: Any = buf.backend._wire  # type: ignore[attr-defined]
            watched = wire.watched
            lost: list[bool] = []

            async def reply_lost(reads: bytes, replies: int, then: Any) -> Any:
                out = await watched(reads, replies, then)
                if not lost:
                    lost.append(True)
                    raise RedisConnectionError("connection lost reading the reply")
                return out

            wire.watched = reply_lost
            await admin.config_resetstat()
            res = await buf.resolve_and_replay("s", _ahead(ids[0]))
            assert lost
            assert res.verdict is Verdict.AHEAD_OF_HIGH_WATER, res
            assert res.evidence.torn_down
            stats = await command_calls(admin)
            assert stats["exec"] == 1 and "fcall" not in stats, stats
    finally:
        await admin.aclose()

"""A failure the fast read decided: torn down by one ``fail.lua`` call, fallbacks, leftovers.

Each test steps in between the fast read and the teardown call to make what
a concurrent replica could do happen at the worst moment: a change of the
session that changes the verdict, a teardown by someone else, a reply lost
after the script ran, the session opened again before its leftover lists
are deleted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from replaystore import ReplayBuffer, Verdict
from replaystore.cursor import sequence_tag
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


def _before_fail(buf: ReplayBuffer, meddle: Callable[[], Awaitable[Any]]) -> list[str]:
    """Run ``meddle`` once, right before the first ``fail.lua`` call; returns the calls seen."""
    backend: Any = buf.backend
    run = backend._run
    seen: list[str] = []

    async def meddling(name: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(name)
        if name == "fail" and seen.count("fail") == 1:
            await meddle()
        return await run(name, *args, **kwargs)

    backend._run = meddling
    return seen


async def _keys(admin: aioredis.Redis, pattern: str) -> list[str]:
    return sorted([k.decode() async for k in admin.scan_iter(match=pattern, count=1000)])


async def test_a_verdict_changed_before_the_teardown_is_judged_again(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """The named sequence is created by another replica after the fast read
    decided ``unknown_sequence``: the teardown's condition no longer holds,
    so it deletes nothing, and the facts script judges the resume again on
    the new state (the cursor's event belongs to another sequence than the
    one named now) and tears it down with that verdict."""
    async with (
        ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf,
        ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as other,
    ):
        ids = await _session(buf, "s")
        seen = _before_fail(buf, lambda: other.append("s", "z", b"new"))
        res = await buf.resolve_and_replay("s", ids[0], sequence="z")
        assert seen[0] == "fail" and "facts" in seen, seen
        assert res.verdict is Verdict.SEQUENCE_MISMATCH, res
        assert res.evidence.torn_down
        gone = await buf.resolve("s", ids[0])
        assert gone.evidence.tombstone is not None
        assert gone.evidence.tombstone.verdict is Verdict.SEQUENCE_MISMATCH


async def test_another_incarnation_is_never_torn_down_for_the_old_ones_verdict(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """The session is closed and opened again between the fast read (which
    decided ``ahead`` on the first incarnation) and the teardown: the new
    incarnation is not torn down for the old one's verdict; judged again,
    the cursor is foreign to it."""
    async with (
        ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf,
        ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as other,
    ):
        ids = await _session(buf, "s")

        async def reopen() -> None:
            assert await other.close_session("s")
            await other.open_session("s")
            await other.append("s", "q", b"new")

        _before_fail(buf, reopen)
        res = await buf.resolve_and_replay("s", _ahead(ids[0]))
        assert res.verdict is Verdict.FOREIGN_CURSOR, res
        assert res.evidence.torn_down


async def test_a_session_gone_before_the_teardown_names_its_tombstone(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """Another replica closed the session after the fast read: the teardown
    finds it gone and not by its own hand, and the script path names the
    tombstone (closed, not failed)."""
    async with (
        ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf,
        ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as other,
    ):
        ids = await _session(buf, "s")

        async def close() -> None:
            assert await other.close_session("s")

        _before_fail(buf, close)
        res = await buf.resolve_and_replay("s", _ahead(ids[0]))
        assert res.verdict is Verdict.UNKNOWN_SESSION, res
        assert res.evidence.tombstone is not None
        assert res.evidence.tombstone.verdict is None


async def test_a_lost_reply_is_recognised_by_its_nonce(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """The teardown ran but its reply was lost: the call is sent again, finds
    the session gone with its own tombstone (by the nonce in it) and answers
    the verdict it tore down with, not "unknown session"; no other script
    judges it."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
            ids = await _session(buf, "s")
            backend: Any = buf.backend
            run = backend._run
            seen: list[str] = []

            async def reply_lost(name: str, *args: Any, **kwargs: Any) -> Any:
                seen.append(name)
                if name != "fail":
                    return await run(name, *args, **kwargs)
                wire = backend._wire
                roundtrip = wire.roundtrip

                async def lose(packet: bytes) -> Any:
                    await roundtrip(packet)  # it ran
                    wire.roundtrip = roundtrip
                    raise RedisConnectionError("connection lost reading the reply")

                wire.roundtrip = lose
                return await run(name, *args, **kwargs)

            backend._run = reply_lost
            await admin.config_resetstat()
            res = await buf.resolve_and_replay("s", _ahead(ids[0]))
            assert res.verdict is Verdict.AHEAD_OF_HIGH_WATER, res
            assert res.evidence.torn_down
            assert seen == ["fail"], seen
            assert (await command_calls(admin))["fcall"] == 2  # the call and its retry
            gone = await buf.resolve("s", ids[0])
            assert gone.evidence.tombstone is not None
            assert gone.evidence.tombstone.verdict is Verdict.AHEAD_OF_HIGH_WATER
    finally:
        await admin.aclose()


async def test_every_leftover_list_is_deleted(scratch_server: ServerHandle, prefix: str) -> None:
    """Sessions of several sequences, some with evicted elements still in
    their lists (tags in the dirty set), each torn down by a failure the fast
    read decided: the lists the teardown could not declare are deleted in
    batches (past the batch size, and by the timer), and only the tombstones
    are left."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix, max_events=6) as buf:
            backend: Any = buf.backend
            backend._leftovers.size = 100  # several batches
            cursors = {}
            for n in range(60):
                session = f"s{n}"
                await buf.open_session(session)
                for _ in range(3):
                    for sequence in ("a", "b", "c", "d"):
                        last = await buf.append(session, sequence, b"x")
                cursors[session] = _ahead(last)
            assert backend._sweep_threshold > 4  # evicted elements stay in their lists
            dirty = await admin.smembers(f"{backend.key_base('s0')}:g")
            assert dirty, "no evicted elements left for a sweep"
            for session, cursor in cursors.items():
                res = await buf.resolve_and_replay(session, cursor)
                assert res.verdict is Verdict.AHEAD_OF_HIGH_WATER, res
                assert res.evidence.torn_down
        # Closing the buffer sends what was still pending.
        left = await _keys(admin, f"{prefix}*")
        assert left == sorted(f"{backend.key_base(s)}:t" for s in cursors), left
    finally:
        await admin.aclose()


async def test_the_timer_deletes_leftover_lists(scratch_server: ServerHandle, prefix: str) -> None:
    """A lone teardown's leftovers do not wait for the buffer to close."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
            ids = await _session(buf, "s")
            base = buf.backend.key_base("s")  # type: ignore[attr-defined]
            res = await buf.resolve_and_replay("s", _ahead(ids[0]))
            assert res.evidence.torn_down
            for _ in range(200):
                if await _keys(admin, f"{base}*") == [f"{base}:t"]:
                    break
                await anyio.sleep(0.02)
            assert await _keys(admin, f"{base}*") == [f"{base}:t"]
    finally:
        await admin.aclose()


async def test_a_session_opened_again_keeps_its_lists(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """A session id can be opened again once torn down. Its new incarnation
    creates a sequence whose list has the name of a leftover list still
    waiting for deletion: the deletion leaves it alone (the session is live
    again), and the new events stay."""
    async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
        backend: Any = buf.backend
        backend._leftovers.delay = 60.0  # flushed below, not by the timer
        ids = await _session(buf, "s")
        res = await buf.resolve_and_replay("s", _ahead(ids[0]))  # r's list left for later
        assert res.evidence.torn_down
        assert backend._leftovers.pending == 2  # the meta hash and r's list
        await buf.open_session("s")
        new = await buf.append_many("s", "r", [b"n1", b"n2"])
        await backend._leftovers.flush()
        client = backend.client
        assert await client.llen(f"{backend.key_base('s')}:q:{sequence_tag('r')}") == 2
        again = await buf.resolve_and_replay("s", new[0])
        assert again.verdict is Verdict.RESUMED, again
        assert [e.payload for e in again.events] == [b"n2"]

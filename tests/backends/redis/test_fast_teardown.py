"""A failure the fast read decided: its teardown on either path, the fallbacks, the leftovers.

Where the wire sends commands by hand (``watch``: a plain client of a real
server) the teardown is an optimistic transaction (``DirectWire.watched``) that
deletes every list; elsewhere (``script``: here the same server with the
wire off, as for a client it does not handle; the cluster has its own test)
it is one ``fail.lua`` call whose undeclared lists go later, in a batch.

Each test steps in right before the teardown (or between the transaction's
two packets) to make what a concurrent replica could do happen at the worst
moment: a change of the session that changes the verdict, a teardown by
someone else, a reply lost after the teardown ran, the session opened again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from replaystore import ReplayBuffer, Verdict
from replaystore.backends.redis import wire as wire_module
from replaystore.cursor import sequence_tag
from replaystore.testing.servers import ServerHandle

from ._support import command_calls

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]


@pytest.fixture(params=["watch", "script"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which teardown runs: the transaction (wire by hand) or ``fail.lua`` (wire off)."""
    if request.param == "script":
        monkeypatch.setattr(wire_module, "BY_HAND", False)
    return str(request.param)


def _ahead(event_id: str) -> str:
    """The same cursor, its position moved past anything the session issued."""
    position = event_id.split("-")[1].split(".")[0]
    return event_id.replace(f"-{position}.", "-99.", 1)


async def _session(buf: ReplayBuffer, name: str) -> list[str]:
    await buf.open_session(name)
    return [await buf.append(name, s, b"x") for s in ("q", "r")]


def _before_teardown(buf: ReplayBuffer, meddle: Callable[[], Awaitable[Any]]) -> list[str]:
    """Run ``meddle`` once, right before the fast teardown; returns the steps seen.

    The steps are the scripts run (``fail``, ``facts``, ``close``...) and
    ``watched`` for a transaction.
    """
    backend: Any = buf.backend
    run, wire = backend._run, backend._wire
    watched = getattr(wire, "watched", None)  # None: a wire that runs no transaction
    seen: list[str] = []

    async def meddling(name: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(name)
        if name == "fail" and seen.count("fail") == 1:
            await meddle()
        return await run(name, *args, **kwargs)

    async def meddling_watched(reads: bytes, replies: int, then: Any) -> Any:
        seen.append("watched")
        if seen.count("watched") == 1:
            await meddle()
        assert watched is not None
        return await watched(reads, replies, then)

    backend._run = meddling
    if watched is not None:
        wire.watched = meddling_watched
    return seen


def _teardown(path: str) -> str:
    return "watched" if path == "watch" else "fail"


async def _keys(admin: aioredis.Redis, pattern: str) -> list[str]:
    return sorted([k.decode() async for k in admin.scan_iter(match=pattern, count=1000)])


async def test_a_verdict_changed_before_the_teardown_is_judged_again(
    scratch_server: ServerHandle, prefix: str, path: str
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
        seen = _before_teardown(buf, lambda: other.append("s", "z", b"new"))
        res = await buf.resolve_and_replay("s", ids[0], sequence="z")
        assert seen[0] == _teardown(path) and "facts" in seen, seen
        assert res.verdict is Verdict.SEQUENCE_MISMATCH, res
        assert res.evidence.torn_down
        gone = await buf.resolve("s", ids[0])
        assert gone.evidence.tombstone is not None
        assert gone.evidence.tombstone.verdict is Verdict.SEQUENCE_MISMATCH


async def test_another_incarnation_is_never_torn_down_for_the_old_ones_verdict(
    scratch_server: ServerHandle, prefix: str, path: str
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

        seen = _before_teardown(buf, reopen)
        res = await buf.resolve_and_replay("s", _ahead(ids[0]))
        assert seen[0] == _teardown(path) and "facts" in seen, seen
        assert res.verdict is Verdict.FOREIGN_CURSOR, res
        assert res.evidence.torn_down


async def test_a_session_gone_before_the_teardown_names_its_tombstone(
    scratch_server: ServerHandle, prefix: str, path: str
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

        seen = _before_teardown(buf, close)
        res = await buf.resolve_and_replay("s", _ahead(ids[0]))
        assert seen[0] == _teardown(path), seen
        assert res.verdict is Verdict.UNKNOWN_SESSION, res
        assert res.evidence.tombstone is not None
        assert res.evidence.tombstone.verdict is None


async def test_a_gone_session_ends_the_watch(scratch_server: ServerHandle, prefix: str) -> None:
    """The transaction's read finds the session gone: it ends its ``WATCH``,
    so the connection goes back to the pool clean."""
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

            async def close() -> None:
                assert await other.close_session("s")

            seen = _before_teardown(buf, close)
            res = await buf.resolve_and_replay("s", _ahead(ids[0]))
            assert seen[0] == "watched", seen
            assert res.verdict is Verdict.UNKNOWN_SESSION, res
            # The one pooled connection holds no WATCH: a write to the key it
            # watched does not abort the next transaction on it.
            await admin.set(f"{base}:m", b"x")
            async with client.pipeline(transaction=True) as pipe:
                pipe.ping()
                assert await pipe.execute() == [True]
    finally:
        await admin.aclose()
        await client.aclose()


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


async def test_a_lost_reply_is_recognised_by_its_nonce(
    scratch_server: ServerHandle, prefix: str, path: str
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
            library, wire = backend._library, backend._wire
            call = library.call
            watched = getattr(wire, "watched", None)  # None: a wire that runs no transaction
            seen: list[str] = []

            async def reply_lost(name: str, *args: Any, **kwargs: Any) -> Any:
                seen.append(name)
                out = await call(name, *args, **kwargs)
                if seen.count(name) == 1:
                    raise RedisConnectionError("connection lost reading the reply")
                return out

            async def exec_reply_lost(reads: bytes, replies: int, then: Any) -> Any:
                seen.append("watched")
                assert watched is not None
                out = await watched(reads, replies, then)
                if seen.count("watched") == 1:
                    raise RedisConnectionError("connection lost reading the reply")
                return out

            library.call = reply_lost
            if watched is not None:
                wire.watched = exec_reply_lost
            await admin.config_resetstat()
            res = await buf.resolve_and_replay("s", _ahead(ids[0]))
            assert res.verdict is Verdict.AHEAD_OF_HIGH_WATER, res
            assert res.evidence.torn_down
            assert seen == [_teardown(path)] * 2, seen  # the call and its retry
            stats = await command_calls(admin)
            if path == "watch":
                assert stats["exec"] == 1 and "fcall" not in stats, stats
            else:
                assert stats["fcall"] == 2 and "exec" not in stats, stats
            gone = await buf.resolve("s", ids[0])
            assert gone.evidence.tombstone is not None
            assert gone.evidence.tombstone.verdict is Verdict.AHEAD_OF_HIGH_WATER
    finally:
        await admin.aclose()


async def test_every_list_is_deleted(scratch_server: ServerHandle, prefix: str, path: str) -> None:
    """Sessions of several sequences, some with evicted elements still in
    their lists (tags in the dirty set), each torn down by a failure the fast
    read decided: the transaction deletes every list at once; ``fail.lua``
    deletes the cursor's, and the others go in batches (past the batch size,
    and when the buffer closes). Only the tombstones are left."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix, max_events=6) as buf:
            backend: Any = buf.backend
            backend._leftovers.size = 100  # several batches
            backend._leftovers.delay = 60.0  # not the timer
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
            await admin.config_resetstat()
            for session, cursor in cursors.items():
                res = await buf.resolve_and_replay(session, cursor)
                assert res.verdict is Verdict.AHEAD_OF_HIGH_WATER, res
                assert res.evidence.torn_down
            stats = await command_calls(admin)
            tombstones = sorted(f"{backend.key_base(s)}:t" for s in cursors)
            if path == "watch":
                assert stats["exec"] == len(cursors) and "fcall" not in stats, stats
                assert await _keys(admin, f"{prefix}*") == tombstones
                assert backend._leftovers.pending == 0
            else:
                # One call per session, and batches already sent past the size.
                assert len(cursors) < stats["fcall"] < 2 * len(cursors), stats
                assert "exec" not in stats, stats
        # Closing the buffer sends what was still pending.
        left = await _keys(admin, f"{prefix}*")
        assert left == tombstones, left
    finally:
        await admin.aclose()


async def test_the_timer_deletes_leftover_lists(
    scratch_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone ``fail.lua`` teardown's leftovers do not wait for the buffer to close."""
    monkeypatch.setattr(wire_module, "BY_HAND", False)
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
            ids = await _session(buf, "s")
            base = buf.backend.key_base("s")  # type: ignore[attr-defined]
            res = await buf.resolve_and_replay("s", _ahead(ids[0]))
            assert res.evidence.torn_down
            assert await _keys(admin, f"{base}*") != [f"{base}:t"]  # r's list, for later
            for _ in range(200):
                if await _keys(admin, f"{base}*") == [f"{base}:t"]:
                    break
                await anyio.sleep(0.02)
            assert await _keys(admin, f"{base}*") == [f"{base}:t"]
    finally:
        await admin.aclose()


async def test_a_session_opened_again_keeps_its_lists(
    scratch_server: ServerHandle, prefix: str, path: str
) -> None:
    """A session id can be opened again once torn down. Its new incarnation
    creates a sequence whose list has the name of a list of the torn-down
    one: the transaction deleted that at once, and ``fail.lua`` left it to a
    batch still waiting, which leaves it alone (the session is live again).
    Either way the new events stay."""
    async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
        backend: Any = buf.backend
        backend._leftovers.delay = 60.0  # flushed below, not by the timer
        ids = await _session(buf, "s")
        res = await buf.resolve_and_replay("s", _ahead(ids[0]))
        assert res.evidence.torn_down
        # The meta hash and r's list wait for the batch, or nothing does.
        assert backend._leftovers.pending == (0 if path == "watch" else 2)
        await buf.open_session("s")
        new = await buf.append_many("s", "r", [b"n1", b"n2"])
        await backend._leftovers.flush()
        client = backend.client
        assert await client.llen(f"{backend.key_base('s')}:q:{sequence_tag('r')}") == 2
        again = await buf.resolve_and_replay("s", new[0])
        assert again.verdict is Verdict.RESUMED, again
        assert [e.payload for e in again.events] == [b"n2"]


async def test_without_the_wire_it_is_one_script_call_and_the_rest_goes_in_a_batch(
    scratch_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client the wire does not send by hand cannot hold a ``WATCH`` between
    two packets: the teardown is one ``fail.lua`` call after the fast read,
    no transaction, no sweep. It deletes the fixed keys and the cursor's
    list; the session's other lists go later, several sessions' in one call.
    Only the tombstone is left, carrying the verdict."""
    monkeypatch.setattr(wire_module, "BY_HAND", False)
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
            backend: Any = buf.backend
            backend._leftovers.delay = 60.0  # flushed below, not by the timer
            bases = []
            for session, sequences in (("one", ["q"]), ("three", ["q", "r", "s"])):
                await buf.open_session(session)
                ids = [await buf.append(session, s, b"x") for s in sequences]
                await admin.config_resetstat()
                res = await buf.resolve_and_replay(session, _ahead(ids[0]))
                assert res.verdict is Verdict.AHEAD_OF_HIGH_WATER, res
                assert res.evidence.torn_down
                stats = await command_calls(admin)
                assert stats["fcall"] == 1 and "exec" not in stats, stats
                base = backend.key_base(session)
                bases.append(base)
                others = [f"{base}:q:{sequence_tag(s)}" for s in sequences[1:]]
                assert await _keys(admin, f"{base}*") == sorted([f"{base}:t", *others])
                again = await buf.resolve_and_replay(session, ids[0])
                assert again.verdict is Verdict.UNKNOWN_SESSION
                assert again.evidence.tombstone is not None
                assert again.evidence.tombstone.verdict is Verdict.AHEAD_OF_HIGH_WATER
            await admin.config_resetstat()
            await backend._leftovers.flush()
            assert (await command_calls(admin))["fcall"] == 1  # both sessions' lists
            for base in bases:
                assert await _keys(admin, f"{base}*") == [f"{base}:t"]
    finally:
        await admin.aclose()


async def _until_queued(buf: ReplayBuffer, count: int) -> None:
    """Hold the first transaction until ``count`` teardowns wait behind it (what a storm does)."""
    teardowns = buf.backend._teardowns  # type: ignore[attr-defined]
    with anyio.fail_after(10):
        while len(teardowns._queue) < count:  # noqa: ASYNC110 (no event to wait on in there)
            await anyio.sleep(0.001)


async def test_failures_together_share_a_transaction(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """Twenty sessions' failed resumes at once go down in fewer transactions
    than sessions (each waits for the one under way, then they go together),
    each with its own tombstone and verdict, and nothing of them is left."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
            names = [f"s{i}" for i in range(20)]
            ids = {name: await _session(buf, name) for name in names}
            wire: Any = buf.backend._wire  # type: ignore[attr-defined]
            watched = wire.watched
            batches: list[int] = []

            async def counting(reads: bytes, replies: int, then: Any) -> Any:
                batches.append((replies - 1) // 2)  # WATCH, then two reads per session
                if len(batches) == 1:
                    await _until_queued(buf, 19)
                return await watched(reads, replies, then)

            wire.watched = counting
            results = await asyncio.gather(
                *(buf.resolve_and_replay(name, _ahead(ids[name][0])) for name in names)
            )
            assert all(r.verdict is Verdict.AHEAD_OF_HIGH_WATER for r in results), results
            assert all(r.evidence.torn_down for r in results)
            assert batches == [1, 19], batches
            left = await _keys(admin, f"{prefix}*")
            assert left == sorted(f"{buf.backend.key_base(n)}:t" for n in names)  # type: ignore[attr-defined]
            for name in names:
                again = await buf.resolve_and_replay(name, ids[name][1])
                assert again.verdict is Verdict.UNKNOWN_SESSION
                assert again.evidence.tombstone is not None
                assert again.evidence.tombstone.verdict is Verdict.AHEAD_OF_HIGH_WATER
    finally:
        await admin.aclose()


async def test_a_session_changed_within_a_batch_costs_the_others_nothing(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """One session of a batch is written between the reads and the ``EXEC``
    (another replica appended to it): the ``EXEC`` runs nothing, and each
    session is tried again alone, so the others still go down and the busy
    one is judged on its new state; nothing is torn down twice or wrongly."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    meddler = redis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
            names = [f"s{i}" for i in range(6)]
            ids = {name: await _session(buf, name) for name in names}
            busy: list[str] = []
            wire: Any = buf.backend._wire  # type: ignore[attr-defined]
            watched = wire.watched
            batches: list[int] = []

            async def meddling(reads: bytes, replies: int, then: Any) -> Any:
                batches.append((replies - 1) // 2)
                if len(batches) == 1:
                    await _until_queued(buf, 5)

                def late(first: list[Any]) -> tuple[bytes, int]:
                    if len(batches) == 2:  # the batch of five: its first session
                        busy.append(reads.split(b"\r\n")[4].decode())
                        meddler.hset(busy[0], "gc", 0)
                    return then(first)  # type: ignore[no-any-return]

                return await watched(reads, replies, late)

            wire.watched = meddling
            await admin.config_resetstat()
            results = await asyncio.gather(
                *(buf.resolve_and_replay(name, _ahead(ids[name][0])) for name in names)
            )
            assert all(r.verdict is Verdict.AHEAD_OF_HIGH_WATER for r in results), results
            assert all(r.evidence.torn_down for r in results)
            assert batches == [1, 5, 1, 1, 1, 1, 1], batches
            stats = await command_calls(admin)
            assert stats["exec"] == len(batches), stats
            left = await _keys(admin, f"{prefix}*")
            assert left == sorted(f"{buf.backend.key_base(n)}:t" for n in names)  # type: ignore[attr-defined]
    finally:
        meddler.close()
        await admin.aclose()


async def test_callers_waiting_for_their_teardown_keep_the_connections_kept(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """While failed resumes wait for their batched teardown they count as
    calls in flight, so the wire keeps its connections for the resumes that
    follow instead of going through the pool for nearly every call."""
    from replaystore.bench.worker import bounded

    async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
        names = [f"s{i}" for i in range(200)]
        ids = {name: await _session(buf, name) for name in names}
        pool: Any = buf.backend.client.connection_pool  # type: ignore[attr-defined]
        get_connection = pool.get_connection
        taken: list[int] = []

        async def counting(*args: Any, **kwargs: Any) -> Any:
            taken.append(1)
            return await get_connection(*args, **kwargs)

        pool.get_connection = counting
        results: list[Any] = []

        def resume(name: str) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                results.append(await buf.resolve_and_replay(name, _ahead(ids[name][0])))

            return run

        await bounded([resume(n) for n in names], 8)
        assert len(results) == 200
        assert all(
            r.verdict is Verdict.AHEAD_OF_HIGH_WATER and r.evidence.torn_down for r in results
        )
        # 200 fast reads and their batched teardowns: the pool hands out
        # about a connection per concurrent caller, not one per call.
        assert len(taken) <= 40, len(taken)

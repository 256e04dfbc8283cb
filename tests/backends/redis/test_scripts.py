"""The Lua scripts on a real Redis: script-cache loss, round trips, replay cost.

Everything here reads or resets server-wide counters (``INFO commandstats``,
``CONFIG RESETSTAT``) or empties the script cache, so the module runs on a
Redis server of its own (``scratch_server``).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from replaystore import ReplayBuffer, Verdict
from replaystore.testing.servers import ServerHandle

from ._support import bare, client_of, command_calls

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]


async def _library_loaded(client: Any) -> bool:
    from replaystore.backends.redis.scripts import LIBRARY_ID

    names = [
        dict(zip(e[::2], e[1::2], strict=True))[b"library_name"]
        for e in await client.function_list()
    ]
    return f"replaystore_{LIBRARY_ID}".encode() in names


async def test_script_flush_between_operations(scratch_server: ServerHandle, prefix: str) -> None:
    """Every operation loads the function library again when it was flushed
    (a restart without persistence, FUNCTION FLUSH, a failover to a server
    without it)."""
    async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
        client = client_of(buf)
        await client.function_flush()
        info = await buf.open_session("s")
        assert await _library_loaded(client)
        ids = []
        for i in range(3):
            await client.function_flush()
            ids.append(await buf.append("s", "q", b"%d" % i))
            assert await _library_loaded(client)
        await client.function_flush()
        ids += await buf.append_many("s", "q", [b"3", b"4"])
        assert [bare(i) for i in ids] == [f"{info.epoch}-{p}" for p in range(1, 6)]
        await client.function_flush()
        probe = await buf.resolve("s", ids[1])
        assert probe.verdict is Verdict.RESUMED
        await client.function_flush()
        replay = await buf.resolve_and_replay("s", ids[1])
        assert [e.payload for e in replay.events] == [b"2", b"3", b"4"]
        await client.function_flush()
        snapshot = await buf.session_info("s")
        assert snapshot is not None
        assert snapshot.high_water == 5
        await client.function_flush()
        assert await buf.close_session("s") is True


async def test_script_flush_storm_during_appends(scratch_server: ServerHandle, prefix: str) -> None:
    """FUNCTION FLUSH from another connection, in a loop, while two replicas append.

    Nothing may fail and nothing may be lost: the positions of both writers'
    events together are exactly 1..N, each writer's events in its own order.
    """
    rounds = 150
    admin = aioredis.Redis.from_url(scratch_server.url)
    a = ReplayBuffer.from_url(scratch_server.url, prefix=prefix)
    b = ReplayBuffer.from_url(scratch_server.url, prefix=prefix)
    written: dict[str, list[str]] = {"w1": [], "w2": []}
    flushes = 0
    done = anyio.Event()
    try:
        async with a, b:
            await admin.config_resetstat()
            info = await a.open_session("s")

            async def writer(buf: ReplayBuffer, name: str) -> None:
                for i in range(rounds):
                    if i % 10 == 0:
                        ids = await buf.append_many("s", name, [b"%s:%d" % (name.encode(), i)] * 3)
                    else:
                        ids = [await buf.append("s", name, b"%s:%d" % (name.encode(), i))]
                    written[name] += ids

            async def flusher() -> None:
                nonlocal flushes
                while not done.is_set():
                    await admin.function_flush()
                    flushes += 1
                    await anyio.sleep(0.001)

            async with anyio.create_task_group() as tg:
                tg.start_soon(flusher)
                async with anyio.create_task_group() as writers:
                    writers.start_soon(writer, a, "w1")
                    writers.start_soon(writer, b, "w2")
                done.set()

            stats = await command_calls(admin)
            assert flushes > 10
            # The reload really ran: some calls found no function and loaded the library.
            assert stats.get("function|load", 0) > 0, stats

            total = len(written["w1"]) + len(written["w2"])
            assert total == 2 * (rounds + rounds // 10 * 2)
            positions: list[int] = []
            for name in ("w1", "w2"):
                replay = await a.resolve_and_replay("s", f"{info.epoch}-0", name)
                assert replay.verdict is Verdict.RESUMED, replay
                assert [e.event_id for e in replay.events] == written[name]
                expected = [
                    b"%s:%d" % (name.encode(), i)
                    for i in range(rounds)
                    for _ in range(3 if i % 10 == 0 else 1)
                ]
                assert [e.payload for e in replay.events] == expected
                positions += [e.position for e in replay.events]
            assert sorted(positions) == list(range(1, total + 1))
    finally:
        await admin.aclose()


class _CountingClient:
    """Records every round trip the buffer's backend makes.

    The backend sends everything through four methods of its wire:
    ``roundtrip`` (one packed command: a script call), ``pipelined`` (several
    commands in one packet), ``shared`` (the same, for a packet that may go
    out with other calls' packets) and ``watched`` (two packets on one
    connection: an optimistic transaction). Wrapping them sees every round
    trip, as ``["FCALL", ...]``, ``"PIPELINE"`` and two ``"WATCHED"`` entries.
    """

    def __init__(self, backend: Any) -> None:
        self.sent: list[str] = []
        wire = backend._wire
        roundtrip, pipelined, watched = wire.roundtrip, wire.pipelined, wire.watched
        shared = wire.shared

        async def counting_watched(reads: bytes, replies: int, then: Any) -> Any:
            self.sent += ["WATCHED", "WATCHED"]
            return await watched(reads, replies, then)

        wire.watched = counting_watched

        async def counting_roundtrip(packet: bytes) -> Any:
            self.sent.append(packet.split(b"\r\n")[2].decode().upper())
            return await roundtrip(packet)

        async def counting_pipelined(packet: bytes, replies: int) -> Any:
            self.sent.append("PIPELINE")
            return await pipelined(packet, replies)

        async def counting_shared(packet: bytes, replies: int) -> Any:
            self.sent.append("PIPELINE")
            return await shared(packet, replies)

        wire.roundtrip = counting_roundtrip
        wire.pipelined = counting_pipelined
        wire.shared = counting_shared

    def take(self) -> list[str]:
        sent, self.sent = self.sent, []
        return sent


@pytest.mark.parametrize("kind", ["redis", "valkey"])
async def test_one_round_trip_per_operation(
    kind: str, request: pytest.FixtureRequest, prefix: str
) -> None:
    """Each append and append_many is exactly one FCALL; each resume of a
    hinted cursor is exactly one pipelined read and runs no script.

    How it is counted, and why this way: Redis 7.0 (the redis-server used
    here) has no per-connection command counter (its ``CLIENT LIST`` has no
    ``tot-cmds`` field; Valkey 9 has one, but it counts the commands a script
    runs for the connection too, checked), and
    ``INFO commandstats`` counts a script's commands next to the top-level
    ones, so none of them alone tells how many commands the client sent.
    Two counts together do:

    * client side, the backend's two ways to the server are wrapped (one
      command, or one pipelined packet), so the list is exactly the round
      trips;
    * server side, on a server of this module alone, ``CONFIG RESETSTAT`` and
      then ``cmdstat_fcall`` / ``cmdstat_lrange`` must equal the number of
      operations, and no library load or script may have run (the warm-up
      loaded the library).
    """
    server: ServerHandle = request.getfixturevalue(
        "scratch_server" if kind == "redis" else "scratch_valkey"
    )
    n = 25
    admin = aioredis.Redis.from_url(server.url)
    try:
        async with ReplayBuffer.from_url(server.url, prefix=prefix) as buf:
            counter = _CountingClient(buf.backend)
            info = await buf.open_session("s")
            warm = await buf.append("s", "q", b"warm-up")  # caches the append script
            await buf.resolve_and_replay("s", warm)
            counter.take()

            async def measure(phase: Any) -> tuple[list[str], dict[str, int]]:
                await admin.config_resetstat()
                counter.take()
                await phase()
                sent = counter.take()
                stats = await command_calls(admin)
                assert "eval" not in stats, stats
                assert "evalsha" not in stats, stats
                assert "function|load" not in stats, stats
                return sent, stats

            ids: list[str] = []

            async def appends() -> None:
                for i in range(n):
                    ids.append(await buf.append("s", "q", b"%d" % i))

            async def replays() -> None:
                for event_id in ids[:n]:
                    replay = await buf.resolve_and_replay("s", event_id)
                    assert replay.verdict is Verdict.RESUMED

            async def burst() -> None:
                ids.extend(await buf.append_many("s", "q", [b"b"] * 100))

            sent, stats = await measure(appends)
            assert sent == ["FCALL"] * n
            assert stats["fcall"] == n
            sent, stats = await measure(replays)
            assert sent == ["PIPELINE"] * n
            assert "multi" not in stats and "exec" not in stats, stats
            assert "fcall" not in stats, stats
            assert stats["lrange"] == n
            sent, stats = await measure(burst)
            assert sent == ["FCALL"]
            assert stats["fcall"] == 1
            # All 100 events were written by that single script run, in one RPUSH.
            assert stats["rpush"] == 1
            assert bare(ids[-1]) == f"{info.epoch}-{1 + n + 100}"
    finally:
        await admin.aclose()


async def _replay_cost(
    buf: ReplayBuffer, admin: Any, session: str, *, mine: int, others: int
) -> tuple[dict[str, int], dict[str, int]]:
    """Build a session, then count the commands one resolve and one replay run.

    ``mine`` events of sequence "mine", the last 11 appended one by one with a
    burst of other sequences' events between each; ``others`` events of three
    other sequences in total. Returns the inner command counts of resolve and
    of resolve_and_replay for the cursor 10 events before "mine"'s high-water.
    """
    info = await buf.open_session(session)
    gaps = 12
    per_gap = others // gaps
    extra = others - per_gap * gaps
    head = mine - 11
    if head:
        await buf.append_many(session, "mine", [b"old"] * head)
    if extra:
        await buf.append_many(session, "o0", [b"o"] * extra)
    tail: list[str] = []
    for i in range(11):
        await buf.append_many(session, f"o{i % 3}", [b"o"] * per_gap)
        tail.append(await buf.append(session, "mine", b"m%d" % i))
    await buf.append_many(session, "o1", [b"o"] * per_gap)
    snapshot = await buf.session_info(session)
    assert snapshot is not None
    assert snapshot.retained == mine + others
    assert snapshot.floor == 1

    cursor = tail[0]
    await buf.resolve(session, cursor)  # warm-up: the script is cached, no NOSCRIPT below
    await admin.config_resetstat()
    probe = await buf.resolve(session, cursor)
    resolve_calls = await command_calls(admin)
    await admin.config_resetstat()
    replay = await buf.resolve_and_replay(session, cursor)
    replay_calls = await command_calls(admin)
    assert probe.verdict is Verdict.RESUMED
    assert replay.verdict is Verdict.RESUMED
    assert [e.event_id for e in replay.events] == tail[1:]
    assert [e.payload for e in replay.events] == [b"m%d" % i for i in range(1, 11)]
    assert info.epoch == replay.evidence.epoch
    return resolve_calls, replay_calls


async def test_replay_cost_independent_of_history(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """Replaying the last 10 events of a sequence costs the same Redis work whatever else is stored.

    Counted, not timed: ``INFO commandstats`` counts each command a script
    issues, so after ``CONFIG RESETSTAT`` the counts are exactly the work one
    resolve did. A session with 100 events of other sequences, one with 20 000,
    and one whose own sequence has 2 000 older events must give identical counts.
    """
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(
            scratch_server.url, prefix=prefix, max_events=100_000
        ) as buf:
            small = await _replay_cost(buf, admin, "small", mine=20, others=100)
            big = await _replay_cost(buf, admin, "big", mine=20, others=20_000)
            deep = await _replay_cost(buf, admin, "deep", mine=2_000, others=100)
    finally:
        await admin.aclose()
    for resolve_calls, replay_calls in (small, big, deep):
        assert resolve_calls.pop("fcall") == 1
        assert "fcall" not in replay_calls
    assert small == big == deep
    # A replay is one pipelined read: the bookkeeping and one native range read.
    resolve_calls, replay_calls = small
    assert replay_calls == {"hmget": 1, "lrange": 1}
    assert sum(resolve_calls.values()) < 20, resolve_calls


async def test_a_resume_reads_two_commands_and_the_script_takes_what_falls_due(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """With an age limit too, a hinted resume is ``HMGET`` and ``LRANGE``: when
    the TTL refresh falls due (``rf``) and when the oldest run ages out
    (``ra``) are read from the meta hash. A session whose meta hash lacks them
    (written by an earlier version), or where either moment is near, is
    resolved by the script, which refreshes, evicts and writes them back: the
    next resume is two commands again."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(
            scratch_server.url, prefix=prefix, max_age=3600.0, session_ttl=600.0
        ) as buf:
            await buf.open_session("s")
            ids = [await buf.append("s", "q", b"%d" % i) for i in range(5)]
            meta = f"{buf.backend.key_base('s')}:m"  # type: ignore[attr-defined]

            async def resume() -> dict[str, int]:
                await admin.config_resetstat()
                replay = await buf.resolve_and_replay("s", ids[1])
                assert replay.verdict is Verdict.RESUMED
                assert [e.event_id for e in replay.events] == ids[2:]
                return await command_calls(admin)

            assert await resume() == {"hmget": 1, "lrange": 1}
            ra, rf = await admin.hmget(meta, "ra", "rf")
            assert ra is not None and rf is not None

            # Written by an earlier version: no 'ra', no 'rf'.
            await admin.hdel(meta, "ra", "rf")
            assert "fcall" in await resume()
            again = await admin.hmget(meta, "ra", "rf")
            assert again[0] == ra and again[1] is not None, again
            assert await resume() == {"hmget": 1, "lrange": 1}

            # The refresh falls due within the clock margin: the script refreshes
            # (early), and the next resume is two commands again.
            await admin.pexpire(meta, 540_000 + 500)
            await admin.hset(meta, "rf", int(time.time() * 1000) + 500)
            stats = await resume()
            assert "fcall" in stats and "pexpire" in stats, stats
            assert await admin.pttl(meta) > 590_000
            assert int(await admin.hget(meta, "rf")) > time.time() * 1000 + 50_000
            assert await resume() == {"hmget": 1, "lrange": 1}

            # An 'rf' near but the TTL not: the script only corrects 'rf'.
            await admin.hset(meta, "rf", int(time.time() * 1000) + 500)
            stats = await resume()
            assert "fcall" in stats and "pexpire" not in stats, stats
            assert int(await admin.hget(meta, "rf")) > time.time() * 1000 + 50_000
            assert await resume() == {"hmget": 1, "lrange": 1}

            # The oldest run ages out within the margin: the script decides
            # (nothing is old enough to go yet, so the resume stands).
            await admin.hset(meta, "ra", int(time.time() * 1000) - 3_600_000 + 500)
            assert "fcall" in await resume()
            assert await admin.hget(meta, "ra") == ra
            assert await resume() == {"hmget": 1, "lrange": 1}
    finally:
        await admin.aclose()


async def test_an_acl_without_functions_runs_scripts(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """A user allowed scripts but not FCALL/FUNCTION still gets every operation."""
    port = scratch_server.ports[0]
    admin = aioredis.Redis(port=port)
    try:
        await admin.acl_setuser(
            "scripts-only",
            enabled=True,
            passwords=["+pw"],
            keys=["*"],
            commands=["+@all", "-fcall", "-function"],
        )
        url = f"redis://scripts-only:pw@127.0.0.1:{port}/0?prefix={prefix}"
        async with ReplayBuffer.from_url(url) as buf:
            await admin.config_resetstat()
            info = await buf.open_session("s")
            ids = await buf.append_many("s", "q", [b"1", b"2"])
            replay = await buf.resolve_and_replay("s", ids[0])
            assert [e.payload for e in replay.events] == [b"2"]
            probe = await buf.resolve("s", f"{info.epoch}-1")
            assert probe.verdict is Verdict.RESUMED
            stats = await command_calls(admin)
            assert stats.get("fcall", 0) == 0, stats  # refused, never run
            assert stats.get("evalsha", 0) + stats.get("eval", 0) >= 3, stats
    finally:
        await admin.acl_deluser("scripts-only")
        await admin.aclose()


async def test_appends_refresh_ttls_lazily_and_keep_the_session(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """An append checks the session's TTL only once the refresh may be due
    (the meta field ``rf``), refreshes every key of the session then (the
    other sequences' lists through a follow-up call), and never lets a key
    run out while appends continue."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix, session_ttl=2.0) as buf:
            await buf.open_session("s")
            await buf.append("s", "other", b"o")
            first = await buf.append("s", "q", b"0")
            base = buf.backend.key_base("s")  # type: ignore[attr-defined]
            keys = [k async for k in admin.scan_iter(match=f"{base}*")]
            assert len(keys) >= 4  # meta, run index, two lists

            # Right after a refresh: no PTTL, no PEXPIRE for the next 0.2 s.
            await admin.config_resetstat()
            for i in range(5):
                await buf.append("s", "q", b"%d" % i)
            stats = await command_calls(admin)
            assert "pttl" not in stats, stats
            assert "pexpire" not in stats, stats

            # Past a tenth of the TTL: the next append refreshes every key.
            await anyio.sleep(0.3)
            await admin.config_resetstat()
            await buf.append("s", "q", b"late")
            stats = await command_calls(admin)
            assert stats.get("pexpire", 0) >= len(keys), stats
            for key in keys:
                assert 1800 < await admin.pttl(key) <= 2000, key

            # Appends alone keep the session, and its other sequence, alive
            # well past one TTL.
            for _ in range(12):
                await anyio.sleep(0.3)
                await buf.append("s", "q", b"tick")
            replay = await buf.resolve_and_replay("s", first)
            assert replay.verdict is Verdict.RESUMED
            assert len(replay.events) == 5 + 1 + 12  # everything after `first`
            info = await buf.session_info("s")
            assert info is not None and set(info.sequences) == {"other", "q"}
            for key in keys:
                assert await admin.pttl(key) > 0, key
    finally:
        await admin.aclose()


@pytest.mark.parametrize("max_age", [None, 3600.0])
async def test_run_index_holds_one_entry_per_stretch(
    scratch_server: ServerHandle, prefix: str, max_age: float | None
) -> None:
    """The run index grows by one entry when the session's newest event
    changes sequence (or a run is older than the split time), never per
    event: it is what eviction walks, and it counts in the memory per event."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix, max_age=max_age) as buf:
            await buf.open_session("s")
            index = buf.backend.key_base("s") + ":i"  # type: ignore[attr-defined]
            await buf.append_many("s", "a", [b"x"] * 300)
            for _ in range(20):
                await buf.append("s", "a", b"y")
            assert await admin.llen(index) == 1
            for switch in range(6):
                await buf.append_many("s", "ab"[switch % 2], [b"z"] * 3)
            await buf.append("s", "b", None)  # a priming event continues the run too
            assert await admin.llen(index) == 1 + 5
            info = await buf.session_info("s")
            assert info is not None and info.retained == 300 + 20 + 18 + 1
    finally:
        await admin.aclose()


async def test_a_failure_the_fast_read_decides_is_torn_down_without_a_script(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """A failed resume whose verdict the fast read decides (here a cursor
    past the high-water) is torn down in an optimistic transaction after that
    read: ``WATCH`` and the reads, then ``MULTI``/``EXEC``, no script. It
    deletes every list of the session, so no sweep follows whatever the
    number of sequences. Only the tombstone is left, carrying the verdict."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as buf:
            counter = _CountingClient(buf.backend)
            for session, sequences in (("one", ["q"]), ("three", ["q", "r", "s"])):
                await buf.open_session(session)
                ids = [await buf.append(session, s, b"x") for s in sequences]
                counter.take()
                await admin.config_resetstat()
                cursor = ids[0].replace(f"-{ids[0].split('-')[1].split('.')[0]}.", "-99.", 1)
                res = await buf.resolve_and_replay(session, cursor)
                assert res.verdict is Verdict.AHEAD_OF_HIGH_WATER, res
                assert res.evidence.torn_down
                assert counter.take() == ["PIPELINE", "WATCHED", "WATCHED"]
                stats = await command_calls(admin)
                assert "fcall" not in stats and stats["exec"] == 1, stats
                base = buf.backend.key_base(session)  # type: ignore[attr-defined]
                left = [k.decode() async for k in admin.scan_iter(match=f"{base}*")]
                assert left == [f"{base}:t"], left
                again = await buf.resolve_and_replay(session, ids[0])
                assert again.verdict is Verdict.UNKNOWN_SESSION
                assert again.evidence.tombstone is not None
                assert again.evidence.tombstone.verdict is Verdict.AHEAD_OF_HIGH_WATER
    finally:
        await admin.aclose()


async def test_teardown_by_the_facts_script_deletes_the_judged_lists_in_the_same_call(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """A failed resume the fast read leaves in doubt and the facts script can
    read for certain (here an evicted cursor whose stamp is not its event's:
    the fast read cannot tell which event it names, the script finds the
    sequence's newest evicted event by position) is one call after the fast
    path's read: the facts
    and the teardown, which deletes the lists it declared (the cursor's
    sequence). Lists of other sequences go later, in a batch with other
    sessions'. Only the tombstone is left."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix, max_events=2) as buf:
            buf.backend._leftovers.delay = 60.0  # type: ignore[attr-defined]
            counter = _CountingClient(buf.backend)
            for session, sequences in (("one", ["q"]), ("two", ["q", "r"])):
                await buf.open_session(session)
                ids = [await buf.append(session, "q", b"x") for _ in range(2)]
                for s in sequences:
                    await buf.append(session, s, b"y")
                await buf.append(session, "q", b"z")
                counter.take()
                head, stamp = ids[0].rsplit(".", 1)
                res = await buf.resolve_and_replay(session, f"{head}.{int(stamp) + 1}")
                assert res.verdict is Verdict.BELOW_FLOOR, res
                assert res.evidence.torn_down
                assert counter.take() == ["PIPELINE", "FCALL"]
                await buf.backend._leftovers.flush()  # type: ignore[attr-defined]
                assert counter.take() == ([] if len(sequences) == 1 else ["FCALL"])
                base = buf.backend.key_base(session)  # type: ignore[attr-defined]
                left = [k.decode() async for k in admin.scan_iter(match=f"{base}*")]
                assert left == [f"{base}:t"], left
    finally:
        await admin.aclose()


async def test_an_evicted_cursor_still_in_its_list_is_decided_by_the_fast_read(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """A cursor whose own event is evicted but still in its list (no sweep
    yet) is decided on the fast read: that read also holds the sequence's
    newest evicted event, the one fact the rules need. An older cursor fails
    and is torn down in the transaction, no script; the newest evicted
    event's cursor resumes exactly, in the one read."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix, max_events=2) as buf:
            counter = _CountingClient(buf.backend)
            await buf.open_session("s")
            ids = [await buf.append("s", "q", b"%d" % i) for i in range(3)]
            await buf.append("s", "r", b"y")  # evicts ids[1]: ids[0] and ids[1] gone from q
            counter.take()
            await admin.config_resetstat()
            newest = await buf.resolve_and_replay("s", ids[1])
            assert newest.verdict is Verdict.RESUMED, newest
            assert [e.payload for e in newest.events] == [b"2"]
            assert counter.take() == ["PIPELINE"]
            older = await buf.resolve_and_replay("s", ids[0])
            assert older.verdict is Verdict.BELOW_FLOOR, older
            assert older.evidence.torn_down
            assert counter.take() == ["PIPELINE", "WATCHED", "WATCHED"]
            stats = await command_calls(admin)
            assert "fcall" not in stats and "evalsha" not in stats, stats
    finally:
        await admin.aclose()


async def test_a_sequence_created_again_gets_the_fast_path_back(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """The list offset a client learnt for a sequence goes stale when the
    session is closed and opened again (a new incarnation: its lists start
    over at offset 0). The first resume after that is judged by the script;
    it makes the client forget the offset, so the next one is read directly.
    A sequence whose events were all evicted goes on where it stopped, with
    its offset: that costs no script at all."""
    async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix, max_events=10) as buf:
        counter = _CountingClient(buf.backend)
        await buf.open_session("s")
        ids = [await buf.append("s", "q", b"%d" % i) for i in range(100)]
        # Compacted in place every 64 evictions: the list offset is 64 now.
        assert (await buf.resolve_and_replay("s", ids[-2])).verdict is Verdict.RESUMED
        counter.take()
        assert (await buf.resolve_and_replay("s", ids[-2])).verdict is Verdict.RESUMED
        assert counter.take() == ["PIPELINE"]
        for i in range(10):  # evicts all of q
            await buf.append("s", "r", b"%d" % i)
        more = [await buf.append("s", "q", b"more %d" % i) for i in range(3)]
        counter.take()
        going_on = await buf.resolve_and_replay("s", more[0])
        assert [e.payload for e in going_on.events] == [b"more 1", b"more 2"]
        assert counter.take() == ["PIPELINE"]
        await buf.close_session("s")
        await buf.open_session("s")
        fresh = [await buf.append("s", "q", b"new %d" % i) for i in range(3)]
        counter.take()
        first = await buf.resolve_and_replay("s", fresh[0])
        assert first.verdict is Verdict.RESUMED, first
        assert [e.payload for e in first.events] == [b"new 1", b"new 2"]
        assert counter.take()[-1] == "FCALL"  # judged by the script
        again = await buf.resolve_and_replay("s", fresh[0])
        assert [e.payload for e in again.events] == [b"new 1", b"new 2"]
        assert counter.take() == ["PIPELINE"]


def _record_forms(backend: Any) -> list[str]:
    """Wrap the backend's wire: the list fills with the form of each append sent."""
    from replaystore.backends.redis.scripts import FUNCTIONS

    appends = {FUNCTIONS[form].encode(): form for form in ("append", "append_lean")}
    forms: list[str] = []
    wire = backend._wire
    roundtrip = wire.roundtrip

    async def recording(packet: bytes) -> Any:
        parts = packet.split(b"\r\n", 5)
        if parts[2].upper() == b"FCALL" and parts[4] in appends:
            forms.append(appends[parts[4]])
        return await roundtrip(packet)

    wire.roundtrip = recording
    return forms


async def test_the_common_append_is_one_lean_call_and_the_rest_goes_general(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """One data event continuing a sequence is one ``append_lean`` call; an
    append that needs more (a new sequence, the cap, a TTL refresh, a sweep,
    a tag collision) costs the lean call's "general" answer and the full
    call, or goes full at once where the client knows (its first append to a
    sequence, a session at its cap), and every result is the same as the
    general path's."""
    admin = aioredis.Redis.from_url(scratch_server.url)
    try:
        async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix, max_events=10) as buf:
            backend: Any = buf.backend
            forms = _record_forms(backend)
            await buf.open_session("s")
            meta = f"{backend.key_base('s')}:m"
            ids = [await buf.append("s", "q", b"%d" % i) for i in range(3)]
            # New to this process: full first; then lean.
            assert forms == ["append", "append_lean", "append_lean"]
            forms.clear()

            # Streams in turn: each new one full once, then lean (runs start).
            for i in range(2):
                for name in ("a", "b"):
                    ids.append(await buf.append("s", name, b"%s%d" % (name.encode(), i)))
            assert forms == ["append", "append", "append_lean", "append_lean"]
            forms.clear()

            # A TTL refresh due: lean says general, the full call refreshes.
            await admin.hset(meta, "rf", 1)
            ids.append(await buf.append("s", "q", b"3"))
            assert forms == ["append_lean", "append"]
            assert int(await admin.hget(meta, "rf")) > 1
            forms.clear()

            # A sweep owed: general, and the full call asks for it.
            await admin.hset(meta, "gc", 10**6)
            ids.append(await buf.append("s", "q", b"4"))
            assert forms == ["append_lean", "append"]
            await admin.hset(meta, "gc", 0)
            forms.clear()

            # Reaching the cap (10 events): the lean call stores the tenth;
            # the next one evicts, so lean says general and the full call
            # says the session is full; from then on appends go full at once.
            info = await buf.session_info("s")
            assert info is not None and info.retained == 9
            for i in range(4):
                ids.append(await buf.append("s", "q", b"cap%d" % i))
            assert forms == ["append_lean", "append_lean", "append", "append", "append"]
            info = await buf.session_info("s")
            assert info is not None and info.retained == 10 and info.floor == len(ids) - 9
            forms.clear()

            # A different name in the sequence's state (a tag collision): the
            # lean call leaves it to the general path, which refuses it.
            from replaystore.errors import SequenceTagCollisionError

            async with ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as other:
                await other.open_session("t")
                other_forms = _record_forms(other.backend)
                await other.append("t", "z", b"z0")
                await other.append("t", "z", b"z1")
                tmeta = f"{backend.key_base('t')}:m"
                tag = next(f for f in await admin.hkeys(tmeta) if f.startswith(b"s:"))
                state = (await admin.hget(tmeta, tag)).rsplit(b",", 1)[0] + b",y"
                await admin.hset(tmeta, tag, state)
                with pytest.raises(SequenceTagCollisionError):
                    await other.append("t", "z", b"z2")
                assert other_forms == ["append", "append_lean", "append_lean", "append"]

            # Every event id handed out is distinct and in position order, and
            # the stream replays exactly.
            positions = [int(bare(i).rsplit("-", 1)[1]) for i in ids]
            assert positions == list(range(1, len(ids) + 1))
            replay = await buf.resolve_and_replay("s", ids[-6])
            assert replay.verdict is Verdict.RESUMED
            assert [e.payload for e in replay.events] == [b"4"] + [b"cap%d" % i for i in range(4)]
            assert [e.event_id for e in replay.events] == ids[-5:]
    finally:
        await admin.aclose()


async def test_a_sequence_another_replica_created_goes_lean_after_one_full_call(
    scratch_server: ServerHandle, prefix: str
) -> None:
    """Two processes append to one sequence in turn: each sends the full form
    once (it cannot know the sequence), then the lean one, and the events
    land in order with no gap."""
    async with (
        ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as one,
        ReplayBuffer.from_url(scratch_server.url, prefix=prefix) as two,
    ):
        forms_one, forms_two = _record_forms(one.backend), _record_forms(two.backend)
        first = await one.append("s", "q", b"0") if await one.open_session("s") else ""
        ids = [first]
        for i in range(1, 7):
            ids.append(await (one if i % 2 == 0 else two).append("s", "q", b"%d" % i))
        assert forms_one == ["append"] + ["append_lean"] * 3
        assert forms_two == ["append"] + ["append_lean"] * 2
        replay = await one.resolve_and_replay("s", ids[0])
        assert [e.payload for e in replay.events] == [b"%d" % i for i in range(1, 7)]
        assert [e.event_id for e in replay.events] == ids[1:]

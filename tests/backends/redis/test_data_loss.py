"""Data lost under a live session: expired keys, a restarted server, eviction.

Redis may lose any key of a session on its own (a TTL, ``maxmemory``
eviction, a restart without persistence). Whatever is lost, a resolve must
either resume with exactly the missed events or give a failure verdict:
never a "resumed" with fewer events, never old positions served from a new
incarnation.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from replaystore import ReplayBuffer, StorageError, UnknownSessionError, Verdict
from replaystore.testing.servers import ServerHandle

from ._support import bare, client_of, key_of, keys_of

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]


async def _lose(client: Any, key: str, how: str) -> None:
    if how == "del":
        assert await client.delete(key) == 1
    else:
        assert await client.pexpire(key, 1)
        await anyio.sleep(0.01)
    assert await client.exists(key) == 0


@pytest.mark.parametrize("how", ["del", "pexpire"])
async def test_sequence_list_lost(redis_server: ServerHandle, prefix: str, how: str) -> None:
    async with (
        ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf,
        ReplayBuffer.from_url(redis_server.url, prefix=prefix, teardown_on_failure=False) as keep,
    ):
        info = await buf.open_session("s")
        old = await buf.append_many("s", "q", [b"1", b"2", b"3", b"4", b"5"])
        other = await buf.append("s", "r", b"r1")
        await _lose(client_of(buf), keys_of(buf, "s", ("q",))[-1], how)

        legacy = [bare(c) for c in old]
        cursors = [(f"{info.epoch}-0", "q"), *((c, None) for c in old + legacy)]
        cursors += [(c, "q") for c in old + legacy]
        for cursor, named in cursors:
            probe = await buf.resolve("s", cursor, named)
            assert probe.verdict is Verdict.NOT_RETAINED, (cursor, probe)
            replay = await keep.resolve_and_replay("s", cursor, named)
            assert replay.verdict is Verdict.NOT_RETAINED, (cursor, replay)
            assert replay.events == []
        # the other sequence is untouched
        assert (await keep.resolve_and_replay("s", other)).verdict is Verdict.RESUMED

        # Appends go on in the same position space; old cursors still fail,
        # cursors issued after the loss resume exactly.
        new = await buf.append_many("s", "q", [b"6", b"7", b"8"])
        assert [bare(c) for c in new] == [f"{info.epoch}-{p}" for p in (7, 8, 9)]
        for cursor in [f"{info.epoch}-0", *old, *legacy]:
            replay = await keep.resolve_and_replay("s", cursor, "q")
            assert replay.verdict is Verdict.NOT_RETAINED, (cursor, replay)
        for cursor in (new[0], bare(new[0])):
            replay = await keep.resolve_and_replay("s", cursor, "q")
            assert replay.verdict is Verdict.RESUMED, replay
            assert [(e.event_id, e.payload) for e in replay.events] == [
                (new[1], b"7"),
                (new[2], b"8"),
            ]

        # A failed replay tears the leftovers down for good.
        torn = await buf.resolve_and_replay("s", old[0])
        assert torn.verdict is Verdict.NOT_RETAINED
        assert torn.evidence.torn_down
        assert (await buf.resolve("s", new[0])).verdict is Verdict.UNKNOWN_SESSION


@pytest.mark.parametrize("how", ["del", "pexpire"])
async def test_run_index_lost(redis_server: ServerHandle, prefix: str, how: str) -> None:
    """The index maps positions to sequences: without it, a cursor without a hint
    cannot be attributed (not_retained); a hinted cursor is checked against its
    own sequence's list and still resumes exactly."""
    async with ReplayBuffer.from_url(
        redis_server.url, prefix=prefix, teardown_on_failure=False
    ) as buf:
        await buf.open_session("s")
        q: list[str] = []
        for i in range(4):
            q += await buf.append_many("s", "q", [b"q%d" % i])
            await buf.append_many("s", "r", [b"r%d" % i])
        await _lose(client_of(buf), key_of(buf, "s", "i"), how)

        for cursor in q[:-1]:
            probe = await buf.resolve("s", bare(cursor), "q")
            assert probe.verdict is Verdict.NOT_RETAINED, (cursor, probe)
            replay = await buf.resolve_and_replay("s", cursor, "q")
            assert replay.verdict is Verdict.RESUMED, (cursor, replay)
            assert [e.event_id for e in replay.events] == q[q.index(cursor) + 1 :]


@pytest.mark.parametrize("then", ["same_sequence", "other_sequence", "max_age"])
async def test_run_index_lost_then_retention_is_due_tears_the_session_down(
    redis_server: ServerHandle, prefix: str, then: str
) -> None:
    """Eviction walks the run index oldest first. Once it is lost (or lost its
    oldest runs, when another sequence started a new run since), retention
    can no longer be kept: the append that needs an eviction tears the
    session down (tombstone ``index_lost``) instead of letting it grow without
    bound or evicting the wrong events. Appends within the cap go on (with
    ``max_age`` too: the events' ages went with the index)."""
    max_age = 3600.0 if then == "max_age" else None
    async with ReplayBuffer.from_url(
        redis_server.url, prefix=prefix, max_events=6, max_age=max_age
    ) as buf:
        await buf.open_session("s")
        q = await buf.append_many("s", "q", [b"q0", b"q1", b"q2"])
        await buf.append("s", "r", b"r0")
        q.append(await buf.append("s", "q", b"q3"))
        client = client_of(buf)
        await client.delete(key_of(buf, "s", "i"))
        if then == "other_sequence":
            await buf.append("s", "r", b"r1")  # a new run: the index is not empty again
        else:
            q.append(await buf.append("s", "q", b"q4"))  # within the cap: kept, and resumable
            replay = await buf.resolve_and_replay("s", q[0], "q")
            assert [e.payload for e in replay.events] == [b"q1", b"q2", b"q3", b"q4"]
        # Six retained, the cap: the next append must evict.
        with pytest.raises(UnknownSessionError):
            await buf.append("s", "q", b"one too many")
        probe = await buf.resolve("s", q[-1])
        assert probe.verdict is Verdict.UNKNOWN_SESSION
        assert probe.evidence.tombstone is not None
        assert "lost the index" in probe.evidence.tombstone.reason
        base = buf.backend.key_base("s")  # type: ignore[attr-defined]
        left = [k.decode() async for k in client.scan_iter(match=f"{base}*")]
        assert left == [key_of(buf, "s", "t")], "every list swept, only the tombstone left"
        with pytest.raises(UnknownSessionError):
            await buf.append("s", "q", b"after")


@pytest.mark.parametrize("how", ["del", "pexpire"])
async def test_meta_key_lost_then_reopened(
    redis_server: ServerHandle, prefix: str, how: str
) -> None:
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        client = client_of(buf)
        meta, index, _dirty, tomb, *_ = keys_of(buf, "s")
        q_list = keys_of(buf, "s", ("q",))[-1]
        first = await buf.open_session("s")
        old = await buf.append_many("s", "q", [b"old1", b"old2", b"old3"])
        old += await buf.append_many("s", "r", [b"r1"])
        await _lose(client, meta, how)
        assert await client.exists(q_list) == 1  # leftovers outlive the meta hash

        gone = await buf.resolve("s", old[0])
        assert gone.verdict is Verdict.UNKNOWN_SESSION
        assert gone.evidence.tombstone is None
        assert await buf.session_info("s") is None
        with pytest.raises(UnknownSessionError):
            await buf.append("s", "q", b"nope")
        assert await client.exists(meta) == 0  # the append did not resurrect it

        second = await buf.open_session("s")
        assert second.epoch != first.epoch
        assert (second.high_water, second.floor, second.retained) == (0, 1, 0)
        # The earlier incarnation's leftovers are gone with it (a sequence's
        # list is reset when the sequence is created again).
        assert await client.exists(index) == 0
        assert await client.exists(tomb) == 0
        new = await buf.append_many("s", "q", [b"new1", b"new2", b"new3", b"new4"])
        assert [bare(c) for c in new] == [f"{second.epoch}-{p}" for p in (1, 2, 3, 4)]
        assert await client.llen(q_list) == 4

        # Old cursors name positions that exist again, in another incarnation:
        # foreign, never a replay of the new events.
        for cursor in [*old, *(bare(c) for c in old), f"{first.epoch}-0"]:
            for named in (None, "q"):
                probe = await buf.resolve("s", cursor, named)
                assert probe.verdict is Verdict.FOREIGN_CURSOR, (cursor, probe)
        replay = await buf.resolve_and_replay("s", old[0], "q")
        assert replay.verdict is Verdict.FOREIGN_CURSOR
        assert replay.events == []


async def test_server_restart_loses_data(own_server: ServerHandle, prefix: str) -> None:
    """A restart without persistence: old cursors fail, never resume into new data.

    The pooled connection died with the old process; the first call after the
    restart meets it, and the backend retries that (idempotent) call once on a
    fresh connection: no error reaches the caller.
    """
    async with (
        ReplayBuffer.from_url(own_server.url, prefix=prefix) as buf,
        ReplayBuffer.from_url(own_server.url, prefix=prefix) as other,
    ):
        first = await buf.open_session("s")
        old = await buf.append_many("s", "q", [b"a", b"b", b"c", b"d"])
        assert (await other.resolve("s", old[0])).verdict is Verdict.RESUMED

        own_server.restart()

        for replica in (buf, other):
            gone = await replica.resolve("s", old[0])
            assert gone.verdict is Verdict.UNKNOWN_SESSION
            assert gone.evidence.tombstone is None

        second = await buf.open_session("s")
        assert second.epoch != first.epoch
        new = await buf.append_many("s", "q", [b"A", b"B", b"C", b"D", b"E"])
        assert [bare(c) for c in new] == [f"{second.epoch}-{p}" for p in range(1, 6)]
        for replica in (buf, other):
            for cursor in [*old, f"{first.epoch}-0"]:
                probe = await replica.resolve("s", cursor, "q")
                assert probe.verdict is Verdict.FOREIGN_CURSOR, (cursor, probe)
        replay = await other.resolve_and_replay("s", old[1])
        assert replay.verdict is Verdict.FOREIGN_CURSOR
        assert replay.events == []
        assert replay.evidence.torn_down


async def test_maxmemory_eviction_never_gives_partial_success(
    own_server: ServerHandle, prefix: str
) -> None:
    """``allkeys-lru`` evicts single keys of live sessions at random.

    Appends go round-robin over many sessions so evictions hit sessions that
    are still being written. Then every cursor of every session is resolved
    (without teardown, so each one is judged on the same data): a ``resumed``
    must carry exactly the events appended after the cursor, anything else
    must be a failure verdict with no events.
    """
    sessions = [f"s{i}" for i in range(120)]
    rounds, batch = 6, 4
    async with (
        ReplayBuffer.from_url(own_server.url, prefix=prefix) as buf,
        ReplayBuffer.from_url(own_server.url, prefix=prefix, teardown_on_failure=False) as check,
    ):
        client = client_of(buf)
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory-policy", "allkeys-lru")
        await client.config_set("maxmemory", used + 1_000_000)

        epochs: dict[str, str] = {}
        expected: dict[str, dict[str, list[tuple[str, bytes]]]] = {}
        dead: set[str] = set()
        storage_errors = 0
        for session in sessions:
            epochs[session] = (await buf.open_session(session)).epoch
            expected[session] = {"a": [], "b": []}
        for r in range(rounds):
            for session in sessions:
                if session in dead:
                    continue
                seq = "ab"[r % 2]
                payloads = [
                    f"{session}/{seq}/{r}/{i}".encode().ljust(300, b".") for i in range(batch)
                ]
                try:
                    ids = await buf.append_many(session, seq, payloads)
                except UnknownSessionError:
                    dead.add(session)  # its meta hash was evicted
                    continue
                except StorageError:
                    storage_errors += 1  # refused (OOM): nothing was stored
                    continue
                expected[session][seq] += list(zip(ids, payloads, strict=True))
        stats = await client.info("stats")
        assert int(stats["evicted_keys"]) > 0

        outcomes: dict[str, int] = {}
        for session in sessions:
            epoch = epochs[session]
            for seq, events in expected[session].items():
                cursors = [f"{epoch}-0"] + [event_id for event_id, _ in events]
                for index, cursor in enumerate(cursors):
                    want = events[index:]
                    for named in (seq, None) if index else (seq,):
                        try:
                            got = await check.resolve_and_replay(session, cursor, named)
                        except StorageError:
                            storage_errors += 1
                            continue
                        outcomes[got.verdict.value] = outcomes.get(got.verdict.value, 0) + 1
                        if got.verdict is Verdict.RESUMED:
                            assert [(e.event_id, e.payload) for e in got.events] == want, (
                                session,
                                cursor,
                                named,
                            )
                        else:
                            assert got.events == [], (session, cursor, got)
                            assert not got.evidence.torn_down
        # The run really mixed intact and damaged sessions.
        assert outcomes.get("resumed", 0) > 0, outcomes
        assert outcomes.get("not_retained", 0) > 0, outcomes  # keys lost under a live meta
        assert outcomes.get("unknown_session", 0) > 0, outcomes  # meta hashes lost
        assert storage_errors == 0, (storage_errors, outcomes)

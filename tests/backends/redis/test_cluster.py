"""Redis Cluster (3 masters): one session lives in one slot, sessions spread over nodes."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
import redis.asyncio as aioredis

from replaystore import ReplayBuffer, StorageError, UnknownSessionError, Verdict
from replaystore.backends.redis.wire import ClusterWire
from replaystore.testing.servers import ServerHandle, find_free_port

from ._support import bare, client_of, keys_of

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

# Session ids are 1..256 visible ASCII characters, braces included.
BRACED = ["a{b}c", "{x}", "{", "{}", "a}b", "{{}}", "x}", "{}}", "a{", "s-{0}-{1}"]
# Ids that start with '}' once gave keys with an empty hash tag.
LEADING_CLOSE = ["}", "}x", "}{", "}}", "}a{b}c"]


async def _node_clients(handle: ServerHandle) -> list[aioredis.Redis]:
    return [aioredis.Redis(host="127.0.0.1", port=port) for port in handle.ports]


async def _basics(buf: ReplayBuffer, other: ReplayBuffer, session: str) -> None:
    """Append, resume (from either replica), fail, tear down: the core contract."""
    info = await buf.open_session(session)
    ids = await buf.append_many(session, "q", [b"1", b"2"])
    ids += [await other.append(session, "q", b"3")]
    assert [bare(i) for i in ids] == [f"{info.epoch}-{p}" for p in (1, 2, 3)]
    for replica in (buf, other):
        replay = await replica.resolve_and_replay(session, ids[0])
        assert replay.verdict is Verdict.RESUMED, (session, replay)
        assert [e.payload for e in replay.events] == [b"2", b"3"]
    torn = await other.resolve_and_replay(session, f"{info.epoch}-7")
    assert torn.verdict is Verdict.AHEAD_OF_HIGH_WATER
    assert torn.evidence.torn_down
    gone = await buf.resolve(session, ids[0])
    assert gone.verdict is Verdict.UNKNOWN_SESSION
    assert gone.evidence.tombstone is not None
    assert gone.evidence.tombstone.verdict is Verdict.AHEAD_OF_HIGH_WATER
    with pytest.raises(UnknownSessionError):
        await buf.append(session, "q", b"4")


async def test_all_keys_of_a_session_in_one_slot(cluster_server: ServerHandle, prefix: str) -> None:
    node = aioredis.Redis(host="127.0.0.1", port=cluster_server.ports[0])
    buf = ReplayBuffer.from_url(cluster_server.url, prefix=prefix)
    try:
        for session in ["plain", "8c2f0d6e-1b4a-4c1e-9a57-3f1e2d4c5b6a", *BRACED]:
            keys = keys_of(buf, session, ("q", "_GET_stream", "{x}"))
            assert len(keys) == 10
            slots = {int(await node.execute_command("CLUSTER", "KEYSLOT", k)) for k in keys}
            assert len(slots) == 1, (session, keys, slots)
    finally:
        await node.aclose()
        await buf.aclose()


async def test_sessions_spread_over_nodes(cluster_server: ServerHandle, prefix: str) -> None:
    """50 sessions land on more than one master; each session's keys sit on exactly one."""
    nodes = await _node_clients(cluster_server)
    try:
        async with ReplayBuffer.from_url(cluster_server.url, prefix=prefix) as buf:
            sessions = [f"sess-{i}" for i in range(50)]
            for session in sessions:
                await buf.open_session(session)
                await buf.append_many(session, "q", [b"a", b"b"])
                await buf.append_many(session, "r", [b"c"])  # creates the links hash
            await buf.close_session(sessions[0])  # leaves a tombstone key instead

            where: dict[str, set[int]] = defaultdict(set)
            count: dict[str, int] = defaultdict(int)
            for node in nodes:
                port = node.connection_pool.connection_kwargs["port"]
                async for key in node.scan_iter(match=f"{prefix}*", count=1000):
                    session = key.decode()[len(prefix) + 1 :].rsplit("}:", 1)[0]
                    where[session].add(port)
                    count[session] += 1
            assert set(where) == set(sessions)
            assert all(len(ports) == 1 for ports in where.values()), where
            assert count[sessions[0]] == 1  # tombstone only
            assert all(count[s] == 4 for s in sessions[1:])  # meta, run index, 2 lists
            used = set().union(*where.values())
            assert len(used) >= 2, used
    finally:
        for node in nodes:
            await node.aclose()


async def test_cluster_basics_with_braced_session_ids(
    cluster_server: ServerHandle, prefix: str
) -> None:
    async with (
        ReplayBuffer.from_url(cluster_server.url, prefix=prefix) as buf,
        ReplayBuffer.from_url(cluster_server.url, prefix=prefix) as other,
    ):
        for session in ["plain", *BRACED]:
            await _basics(buf, other, session)


@pytest.mark.parametrize("session", LEADING_CLOSE)
async def test_session_starting_with_closing_brace(
    cluster_server: ServerHandle, prefix: str, session: str
) -> None:
    """Regression: '<prefix>{}x}:m' has an empty hash tag, so Redis hashed each whole
    key and the four keys of the session fell into different slots (CROSSSLOT)."""
    node = aioredis.Redis(host="127.0.0.1", port=cluster_server.ports[0])
    try:
        probe = ReplayBuffer.from_url(cluster_server.url, prefix=prefix)
        keys = keys_of(probe, session, ("q", "r"))
        slots = {int(await node.execute_command("CLUSTER", "KEYSLOT", k)) for k in keys}
        assert len(slots) == 1, (session, keys, slots)
        await probe.aclose()
    finally:
        await node.aclose()
    async with (
        ReplayBuffer.from_url(cluster_server.url, prefix=prefix) as buf,
        ReplayBuffer.from_url(cluster_server.url, prefix=prefix) as other,
    ):
        await _basics(buf, other, session)


async def test_session_starting_with_closing_brace_works_standalone(
    redis_server: ServerHandle, prefix: str
) -> None:
    """The same ids are fine where there are no slots."""
    async with (
        ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf,
        ReplayBuffer.from_url(redis_server.url, prefix=prefix) as other,
    ):
        for session in LEADING_CLOSE:
            await _basics(buf, other, session)


async def test_unreachable_cluster_is_a_storage_error() -> None:
    """Connecting to a cluster nobody listens on raises StorageError, promptly."""
    url = f"redis+cluster://127.0.0.1:{find_free_port()}"
    buf = ReplayBuffer.from_url(url)
    with pytest.raises(StorageError):
        async with buf:
            pass
    await buf.aclose()


async def test_cluster_client_is_a_cluster_client(cluster_server: ServerHandle) -> None:
    async with ReplayBuffer.from_url(cluster_server.url) as buf:
        assert isinstance(client_of(buf), aioredis.RedisCluster)


async def test_a_failure_the_fast_read_decides_is_one_script_and_its_lists_go_later(
    cluster_server: ServerHandle, prefix: str
) -> None:
    """On a cluster too, a failure the fast read decides is torn down by one
    ``fail.lua`` call (its keys are one slot), no facts script; the lists it
    could not declare go later, one call per slot, and only the tombstones
    are left on any node."""
    nodes = await _node_clients(cluster_server)
    sessions = [f"f{i}" for i in range(40)]
    try:
        async with ReplayBuffer.from_url(cluster_server.url, prefix=prefix) as buf:
            backend: Any = buf.backend
            backend._leftovers.delay = 60.0  # sent when the buffer closes
            cursors = {}
            for session in sessions:
                await buf.open_session(session)
                ids = [await buf.append(session, s, b"x") for s in ("q", "r", "s")]
                position = ids[0].split("-")[1].split(".")[0]
                cursors[session] = ids[0].replace(f"-{position}.", "-99.", 1)
            run = backend._run
            seen: list[str] = []

            async def recording(name: str, *args: Any, **kwargs: Any) -> Any:
                seen.append(name)
                return await run(name, *args, **kwargs)

            backend._run = recording
            for session, cursor in cursors.items():
                res = await buf.resolve_and_replay(session, cursor)
                assert res.verdict is Verdict.AHEAD_OF_HIGH_WATER, res
                assert res.evidence.torn_down
            assert seen == ["fail"] * len(sessions), seen
            assert backend._leftovers.pending == 3 * len(sessions)  # meta, r's and s's lists
        left = []
        for node in nodes:
            left += [k.decode() async for k in node.scan_iter(match=f"{prefix}*", count=1000)]
        assert sorted(left) == sorted(f"{backend.key_base(s)}:t" for s in sessions), left
    finally:
        for node in nodes:
            await node.aclose()


def _count_redis_py_pipelines(wire: Any) -> list[int]:
    """The command count of every pipeline the wire sends through redis-py from now on."""
    pipeline = wire.pipeline
    sent: list[int] = []

    async def counting(commands: Any, **kwargs: Any) -> Any:
        sent.append(len(commands))
        return await pipeline(commands, **kwargs)

    wire.pipeline = counting
    return sent


async def test_resume_reads_go_by_hand_to_the_slots_master_and_follow_a_move(
    cluster_server: ServerHandle, prefix: str
) -> None:
    """On a cluster a resume's read is one packet to the master that holds the
    session's slot, not redis-py's pipeline; when redis-py's slot map names
    the wrong master (a slot moved), that master's MOVED sends the read
    through redis-py, which follows it and corrects its map, and the answer
    is the same."""
    async with ReplayBuffer.from_url(cluster_server.url, prefix=prefix) as buf:
        backend: Any = buf.backend
        client = backend.client
        wire = backend._wire
        assert isinstance(wire, ClusterWire)
        through_redis_py = _count_redis_py_pipelines(wire)
        sessions = [f"h{i}" for i in range(12)]
        ids = {}
        for session in sessions:
            await buf.open_session(session)
            ids[session] = await buf.append_many(session, "q", [b"a", b"b", b"c"])
        for session in sessions:
            replay = await buf.resolve_and_replay(session, ids[session][0])
            assert replay.verdict is Verdict.RESUMED, replay
            assert [e.payload for e in replay.events] == [b"b", b"c"]
        assert through_redis_py == []

        # redis-py's map sends the session's slot to another master.
        meta = f"{backend.key_base('h0')}:m"
        slot = client.keyslot(meta)
        right = client.nodes_manager.slots_cache[slot][0]
        wrong = next(n for n in client.get_primaries() if n.name != right.name)
        client.nodes_manager.slots_cache[slot] = [wrong]
        replay = await buf.resolve_and_replay("h0", ids["h0"][1])
        assert replay.verdict is Verdict.RESUMED
        assert [e.payload for e in replay.events] == [b"c"]
        assert through_redis_py == [2]  # the MOVED read, sent again through redis-py
        assert client.nodes_manager.slots_cache[slot][0].name == right.name
        replay = await buf.resolve_and_replay("h0", ids["h0"][0])
        assert [e.payload for e in replay.events] == [b"b", b"c"]
        assert through_redis_py == [2]  # by hand again, to the right master


async def test_resume_reads_for_one_master_share_a_packet_and_a_moved_one_goes_alone(
    cluster_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thirty resumes at once: their reads go by hand in a few packets per master, not thirty;
    one whose slot redis-py's map names wrongly gets MOVED inside its shared packet and
    alone goes through redis-py; every answer is its own session's."""
    from replaystore.backends.redis.wire import exchange as exchange_module

    async with ReplayBuffer.from_url(cluster_server.url, prefix=prefix) as buf:
        backend: Any = buf.backend
        client = backend.client
        wire = backend._wire
        sessions = [f"p{i}" for i in range(30)]
        ids = {}
        for session in sessions:
            await buf.open_session(session)
            ids[session] = await buf.append_many(session, "q", [b"a", session.encode()])
        through_redis_py = _count_redis_py_pipelines(wire)
        packets: list[int] = []
        exchange = exchange_module.exchange

        async def spied(conn: Any, packet: bytes, replies: int, *args: Any, **kw: Any) -> Any:
            packets.append(replies)
            return await exchange(conn, packet, replies, *args, **kw)

        monkeypatch.setattr(exchange_module, "exchange", spied)
        slot = client.keyslot(f"{backend.key_base('p0')}:m")
        assert all(
            client.keyslot(f"{backend.key_base(s)}:m") != slot for s in sessions[1:]
        )  # p0 alone in its slot
        right = client.nodes_manager.slots_cache[slot][0]
        client.nodes_manager.slots_cache[slot] = [
            next(n for n in client.get_primaries() if n.name != right.name)
        ]
        replies = await asyncio.gather(*(buf.resolve_and_replay(s, ids[s][0]) for s in sessions))
        for session, reply in zip(sessions, replies, strict=True):
            assert reply.verdict is Verdict.RESUMED, (session, reply)
            assert [e.payload for e in reply.events] == [session.encode()]
            assert reply.evidence.session == session
        assert through_redis_py == [2]  # p0's read only, sent again after its MOVED
        assert sum(packets) == 60  # every read went by hand first, p0's to the wrong master
        assert len(packets) <= 9, packets  # a few packets per master, not one per read
        assert client.nodes_manager.slots_cache[slot][0].name == right.name

"""The redis-py names the direct wire relies on are checked, and without them the public path works.

The conformance suite runs once more on a real Redis with the direct wire
off (its ``redis-public`` case); here: the check itself, which clients are
sent by hand, and that turning the wire off really changes the path taken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis
import redis.exceptions

from replaystore import ReplayBuffer, Verdict
from replaystore.backends.redis import redispy, wire
from replaystore.backends.redis.redispy import Requirement
from replaystore.backends.redis.wire import exchange
from replaystore.backends.redis.wire import pool as wire_pool
from replaystore.backends.redis.wire.batching import Batcher
from replaystore.testing.servers import ServerHandle

pytestmark = pytest.mark.anyio


def test_the_installed_redis_py_has_every_name() -> None:
    assert redispy.missing() == []
    assert redispy.BY_HAND is wire.BY_HAND is True


@pytest.mark.parametrize(
    "requirement",
    [
        Requirement("Connection()", "_no_such_writer", "attribute", "a renamed attribute"),
        Requirement("AbstractConnection.read_response", "no_such", "parameter", "a parameter"),
        Requirement("ConnectionPool", "no_such_method", "method", "a method"),
        Requirement("Gone", "anything", "attribute", "an owner that cannot be built"),
    ],
)
def test_a_missing_name_is_found_and_warned_once(requirement: Requirement) -> None:
    owners = {"Gone": lambda: (_ for _ in ()).throw(AttributeError("gone"))}
    assert redispy.missing([requirement], owners) == [requirement]
    with pytest.warns(RuntimeWarning, match=f"{requirement.name}.*{requirement.why}") as seen:
        assert redispy.settle([requirement, *redispy.REQUIREMENTS], owners) is False
    assert len(seen) == 1
    assert "public API" in str(seen[0].message)


def test_every_listed_name_is_used_by_the_wire() -> None:
    """The list names what the code touches, no more: each name appears in the wire's source,
    or in the constant of :mod:`redispy` through which the wire reaches it."""
    code = "".join(path.read_text() for path in Path(wire.__file__).parent.glob("*.py"))
    handed = {"_AsyncHiredisParser": "HIREDIS_PARSER"}
    for r in redispy.REQUIREMENTS:
        assert r.name in code or handed.get(r.name, r.name) in code, r


def _by_hand(buffer: ReplayBuffer) -> bool:
    backend: Any = buffer.backend
    return isinstance(backend._wire, wire.DirectWire)


async def test_only_plain_clients_of_redis_pys_own_connections_go_by_hand(
    redis_server: ServerHandle, cluster_server: ServerHandle
) -> None:
    async with ReplayBuffer.from_url(redis_server.url, prefix="w:") as plain:
        assert _by_hand(plain)
    async with ReplayBuffer.from_url(cluster_server.url, prefix="w:") as cluster:
        assert not _by_hand(cluster)
    fake = fakeredis.FakeAsyncRedis()
    async with ReplayBuffer.from_url("redis://", client=fake, prefix="w:") as faked:
        assert not _by_hand(faked)


@pytest.mark.parametrize("direct", [True, False])
async def test_without_the_names_every_command_goes_through_redis_py(
    redis_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    """Same answers either way; only the path differs (and functions are still used)."""
    monkeypatch.setattr(wire, "BY_HAND", direct)
    by_hand: list[str] = []
    for name in ("roundtrip", "pipelined", "shared"):
        original = getattr(wire.DirectWire, name)

        async def counted(self: Any, *args: Any, _name: str = name, _f: Any = original) -> Any:
            by_hand.append(_name)
            return await _f(self, *args)

        monkeypatch.setattr(wire.DirectWire, name, counted)
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        backend: Any = buf.backend
        assert backend._library.functions
        await buf.open_session("s")
        first = await buf.append("s", "seq", b"a")
        ids = await buf.append_many("s", "seq", [b"b", b"c"])
        replay = await buf.resolve_and_replay("s", first)
        assert replay.verdict is Verdict.RESUMED
        assert [e.event_id for e in replay.events] == ids
        assert backend._library.functions  # FCALL through execute_command works too
    assert bool(by_hand) is direct


def _pool(buffer: ReplayBuffer) -> Any:
    backend: Any = buffer.backend
    return backend.client.connection_pool


async def _sessions(buf: ReplayBuffer, n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        await buf.open_session(f"s{i}")
        first = await buf.append(f"s{i}", "seq", b"a")
        await buf.append(f"s{i}", "seq", b"b")
        out.append((f"s{i}", first))
    return out


async def test_kept_connections_serve_the_next_burst_then_go_back_to_the_pool(
    redis_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst's connections are kept for the next one (no pool checkout), and go back to
    the pool once no call has come for ``IDLE_S``."""
    idle = 0.5  # longer than the test's own steps take on a loaded machine
    monkeypatch.setattr(wire_pool, "IDLE_S", idle)
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        backend: Any = buf.backend
        cursors = await _sessions(buf, 40)
        pool = _pool(buf)
        checkouts = _counted_checkouts(pool)
        ping = wire.pack_one(("PING",))
        for burst in range(3):  # pipelines: each its own packet (``shared`` calls share one)
            pongs = await asyncio.gather(*(backend._wire.pipelined(ping, 1) for _ in cursors))
            assert pongs == [[b"PONG"]] * len(cursors)
            assert backend._wire._pool.in_flight == 0
            assert len(backend._wire._pool.kept) == len(pool._in_use_connections) > 1
            if burst == 0:
                first = checkouts()
                assert first > 1  # the calls did run side by side
        assert checkouts() == first  # the later bursts took the kept ones
        await asyncio.sleep(idle * 2.5)  # given back IDLE_S to twice that after the last call
        assert backend._wire._pool.kept == [] and not pool._in_use_connections
        assert len(pool._available_connections) > 1


async def test_calls_spaced_under_the_idle_wait_keep_their_connection(
    redis_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call at a time, each a little less than ``IDLE_S`` after the last: the connection
    stays kept throughout (the wait starts again after each call), never checked out again."""
    idle = 0.3
    monkeypatch.setattr(wire_pool, "IDLE_S", idle)
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        backend: Any = buf.backend
        pool = _pool(buf)
        ping = wire.pack_one(("PING",))
        assert await backend._wire.pipelined(ping, 1) == [b"PONG"]
        checkouts = _counted_checkouts(pool)
        for _ in range(8):  # 1.6 s: five times the wait, a call every two thirds of it
            await asyncio.sleep(idle * 2 / 3)
            assert await backend._wire.pipelined(ping, 1) == [b"PONG"]
        assert checkouts() == 0
        await asyncio.sleep(idle * 2.5)
        assert backend._wire._pool.kept == []  # and back once the calls stop


def _counted_checkouts(pool: Any) -> Callable[[], int]:
    """Count the connections taken from ``pool`` from now on; the function returned reads it."""
    count = 0
    take = pool.get_connection

    async def counted() -> Any:
        nonlocal count
        count += 1
        return await take()

    pool.get_connection = counted
    return lambda: count


async def test_a_client_passed_in_gets_its_connections_back_at_close(
    redis_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the buffer gives the kept connections back to a client it does not own,
    without waiting for ``IDLE_S``; the client goes on working."""
    monkeypatch.setattr(wire_pool, "IDLE_S", 60.0)  # only the close can give them back
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        async with ReplayBuffer.from_url("redis://", client=client, prefix=prefix) as buf:
            backend: Any = buf.backend
            ping = wire.pack_one(("PING",))
            await asyncio.gather(*(backend._wire.pipelined(ping, 1) for _ in range(10)))
            assert len(client.connection_pool._in_use_connections) > 1  # kept
        assert not client.connection_pool._in_use_connections
        assert await client.ping()
    finally:
        await client.aclose()


async def test_callers_waiting_for_the_pool_get_the_kept_connections(
    redis_server: ServerHandle, prefix: str
) -> None:
    """Two connections, many calls of the wire and of redis-py's own path: none waits for long.

    A connection kept while the pool has none left would leave the calls
    waiting in the pool without one until ``pool_timeout``.
    """
    url = f"{redis_server.url}?max_connections=2&pool_timeout=3"
    async with ReplayBuffer.from_url(url, prefix=prefix) as buf:
        backend: Any = buf.backend
        cursors = await _sessions(buf, 30)
        began = time.monotonic()
        resumes = asyncio.gather(
            *(buf.resolve_and_replay(s, c, sequence="seq") for s, c in cursors)
        )
        pings = asyncio.gather(*(backend.client.ping() for _ in range(30)))
        replies, pongs = await asyncio.gather(resumes, pings)
        assert time.monotonic() - began < 2.5
        assert all(r.ok for r in replies) and all(pongs)
        await asyncio.sleep(wire_pool.IDLE_S * 3)
        assert backend._wire._pool.kept == []


async def test_a_kept_connection_the_server_closed_is_not_used(
    redis_server: ServerHandle, prefix: str
) -> None:
    """A kept connection the server closed goes to the pool to be repaired, never written to:
    an append without an idempotency key (never sent twice) still succeeds."""
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        backend: Any = buf.backend
        wire_ = backend._wire
        await buf.open_session("s")
        busy = await wire_._pool.take()  # a call in flight: the next call's connection is kept
        kept = await wire_._pool.take()
        await kept.send_command("CLIENT", "ID")
        kept_id = await kept.read_response()
        await wire_._pool.give(kept)
        assert wire_._pool.kept == [kept]
        await busy.send_command("CLIENT", "KILL", "ID", kept_id)
        assert await busy.read_response() == 1
        await asyncio.sleep(0.1)  # the server's close reaches the kept connection's reader
        ids = await buf.append_many("s", "seq", [b"a", b"b"])
        assert len(ids) == 2
        await wire_._pool.give(busy)
        assert wire_._pool.in_flight == 0
        assert all(exchange.sound(c) for c in wire_._pool.kept)  # the pool repaired the closed one
        await wire_.give_back()
        assert wire_._pool.kept == [] and not _pool(buf)._in_use_connections


async def test_resp3_replies_and_a_push_message_between_them(
    redis_server: ServerHandle, prefix: str
) -> None:
    """Over RESP3 the replies are read as redis-py reads them; a push message read between two
    replies (here a tracking invalidation of the connection's own write) is not a reply."""
    async with ReplayBuffer.from_url(f"{redis_server.url}?protocol=3", prefix=prefix) as buf:
        backend: Any = buf.backend
        assert isinstance(backend._wire, wire.DirectWire)
        key = f"{prefix}tracked"
        packet = b"".join(
            wire.pack_one(c)
            for c in (
                ("CLIENT", "TRACKING", "ON"),
                ("SET", key, "1"),
                ("GET", key),
                ("SET", key, "2"),  # invalidates the key read just before: a push
                ("GET", key),
                ("CLIENT", "TRACKING", "OFF"),
            )
        )
        got = await backend._wire.pipelined(packet, 6)
        assert got == [b"OK", b"OK", b"1", b"OK", b"2", b"OK"]
        await buf.open_session("s")
        first = await buf.append("s", "seq", b"a")
        await buf.append("s", "seq", None)
        replay = await buf.resolve_and_replay("s", first)
        assert replay.ok and [e.payload for e in replay.events] == [None]
        failed = await buf.resolve_and_replay("s", first, sequence="other")
        assert failed.verdict is Verdict.UNKNOWN_SEQUENCE and failed.evidence.torn_down


def _spy_packets(monkeypatch: pytest.MonkeyPatch, sizes: list[int] | None = None) -> list[int]:
    """The reply count of every packet the wire sends by hand from now on (and its size, in
    ``sizes`` if given)."""
    sent: list[int] = []
    original = exchange.exchange

    async def spied(conn: Any, packet: bytes, replies: int, *args: Any, **kw: Any) -> Any:
        sent.append(replies)
        if sizes is not None:
            sizes.append(len(packet))
        return await original(conn, packet, replies, *args, **kw)

    monkeypatch.setattr(exchange, "exchange", spied)
    return sent


async def test_resumes_in_flight_together_share_their_packets(
    redis_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forty resumes started together: their reads go out in a few packets, not forty, on
    few connections, and each gets exactly its own session's events."""
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        cursors = await _sessions(buf, 40)
        sent = _spy_packets(monkeypatch)
        replies = await asyncio.gather(
            *(buf.resolve_and_replay(s, c, sequence="seq") for s, c in cursors)
        )
        for (session, _), reply in zip(cursors, replies, strict=True):
            assert reply.ok and [e.payload for e in reply.events] == [b"b"]
            assert reply.evidence.session == session
            assert all(e.event_id.startswith(reply.evidence.epoch) for e in reply.events)
        epochs = {r.evidence.epoch for r in replies}
        assert len(epochs) == 40  # forty sessions, forty incarnations: nothing crossed
        assert sum(sent) == 80 and len(sent) <= 3, sent  # HMGET and LRANGE per resume
        assert max(sent) >= 60


async def test_each_read_of_a_shared_packet_gets_its_own_replies(
    redis_server: ServerHandle, prefix: str
) -> None:
    """Reads of different lengths in one packet: each caller gets its replies in order, an
    error reply as a value in its own list only."""
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        w: Any = buf.backend._wire
        client = buf.backend.client  # type: ignore[attr-defined]
        await client.set(f"{prefix}str", "v")
        await client.rpush(f"{prefix}list", "a", "b", "c")
        busy = await w._pool.take()  # another call in flight: ready reads gather
        try:
            reads = [
                [("GET", f"{prefix}str")],
                [("LRANGE", f"{prefix}str", 0, -1), ("GET", f"{prefix}str")],  # WRONGTYPE
                [("LRANGE", f"{prefix}list", 1, -1), ("LLEN", f"{prefix}list"), ("PING",)],
            ]
            got = await asyncio.gather(
                *(w.shared(b"".join(wire.pack_one(c) for c in r), len(r)) for r in reads)
            )
        finally:
            await w._pool.give(busy)
        assert got[0] == [b"v"]
        assert isinstance(got[1][0], redis.exceptions.ResponseError) and got[1][1] == b"v"
        assert got[2] == [[b"b", b"c"], 3, b"PONG"]


async def test_reads_sharing_a_packet_whose_first_caller_is_cancelled_get_their_replies(
    redis_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first read gathered the packet; cancelled while the server holds it, the reads
    that shared it are answered all the same, from that one packet (no read sent again)."""
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
            w: Any = buf.backend._wire
            cursors = await _sessions(buf, 10)
            busy = await w._pool.take()  # another call in flight: the reads gather
            sent = _spy_packets(monkeypatch)
            try:
                await admin.execute_command("CLIENT", "PAUSE", 400, "ALL")
                tasks = [
                    asyncio.create_task(buf.resolve_and_replay(s, c, sequence="seq"))
                    for s, c in cursors
                ]
                await asyncio.sleep(0.1)  # all ten read, in one packet the server holds
                assert not any(t.done() for t in tasks)
                tasks[0].cancel()  # the first one started the packet
                replies = await asyncio.wait_for(asyncio.gather(*tasks[1:]), 5)
            finally:
                await w._pool.give(busy)
            with pytest.raises(asyncio.CancelledError):
                await tasks[0]
            for reply in replies:
                assert reply.ok and [e.payload for e in reply.events] == [b"b"]
            assert sent == [20]  # ten reads of two commands, once
            assert w._pool.in_flight == 0
            # the cancelled packet's connection was dropped, not left to be read by another call
            again = await buf.resolve_and_replay(*cursors[0], sequence="seq")
            assert again.ok and [e.payload for e in again.events] == [b"b"]
    finally:
        await admin.aclose()


async def test_a_read_whose_caller_gave_up_does_not_disturb_the_others(
    redis_server: ServerHandle, prefix: str
) -> None:
    """A read that shares a packet and is cancelled: its replies are read and dropped, the
    others' arrive, and the connection stays in step for the next call."""
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        w: Any = buf.backend._wire
        cursors = await _sessions(buf, 5)
        busy = await w._pool.take()
        try:
            tasks = [
                asyncio.create_task(buf.resolve_and_replay(s, c, sequence="seq"))
                for s, c in cursors
            ]
            await asyncio.sleep(0)  # each has sent its read to the packet
            tasks[3].cancel()
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        finally:
            await w._pool.give(busy)
        assert isinstance(done[3], asyncio.CancelledError)
        for i, reply in enumerate(done):
            if i != 3:
                assert not isinstance(reply, BaseException) and reply.ok
                assert [e.payload for e in reply.events] == [b"b"]
        replies = await asyncio.gather(
            *(buf.resolve_and_replay(s, c, sequence="seq") for s, c in cursors)
        )
        assert all(r.ok and [e.payload for e in r.events] == [b"b"] for r in replies)


async def test_appends_ready_together_share_a_packet_and_a_large_one_goes_alone(
    redis_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thirty appends at once to thirty sessions go out in a few packets; one whose payload
    is larger than ``SHARED_BYTES`` goes in a packet of its own; each is stored once, with
    its own id, and resumes exactly."""
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        cursors = await _sessions(buf, 30)
        await asyncio.gather(*(buf.append(s, "seq", b"warm") for s, _ in cursors))  # lean form
        sizes: list[int] = []
        sent = _spy_packets(monkeypatch, sizes)
        big = b"x" * (wire.SHARED_BYTES + 1)
        payloads = [big if i == 7 else f"p{i}".encode() for i in range(30)]
        ids = await asyncio.gather(
            *(buf.append(s, "seq", p) for (s, _), p in zip(cursors, payloads, strict=True))
        )
        assert len(set(ids)) == 30
        assert sum(sent) == 30 and len(sent) <= 4, sent
        (holding,) = [n for n, size in zip(sent, sizes, strict=True) if size > len(big)]
        assert holding == 1  # the large one, alone
        for (session, first), payload, new_id in zip(cursors, payloads, ids, strict=True):
            replay = await buf.resolve_and_replay(session, first, sequence="seq")
            assert replay.ok
            assert [e.payload for e in replay.events] == [b"b", b"warm", payload]
            assert replay.events[-1].event_id == new_id


async def test_a_call_cancelled_before_its_shared_packet_went_is_not_sent(
    redis_server: ServerHandle, prefix: str
) -> None:
    """The first of three calls gathers their packet and is cancelled before it goes: its
    command never reaches Redis, the other two do, and their callers get their replies."""
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        w: Any = buf.backend._wire
        client: Any = buf.backend.client  # type: ignore[attr-defined]
        busy = await w._pool.take()  # another call in flight: the calls gather
        try:
            tasks = [
                asyncio.create_task(w.roundtrip(wire.pack_one(("SET", f"{prefix}{k}", k))))
                for k in "abc"
            ]
            await asyncio.sleep(0)  # a gathers, b and c join it; a has not sent it yet
            tasks[0].cancel()
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        finally:
            await w._pool.give(busy)
        assert isinstance(done[0], asyncio.CancelledError)
        assert done[1:] == [b"OK", b"OK"]
        assert await client.mget([f"{prefix}{k}" for k in "abc"]) == [None, b"b", b"c"]


class _InFlight:
    in_flight = 1  # another call in flight: ready calls gather


@pytest.mark.parametrize(
    "error", [redis.exceptions.ConnectionError("lost"), AttributeError("a bug")], ids=repr
)
async def test_each_call_of_a_failed_shared_packet_gets_its_error(error: Exception) -> None:
    """Three calls share a packet whose send fails: each caller gets the error, a store's as a
    copy of its own, anything else (a bug) as it is, never made into another error."""
    sent: list[bytes] = []

    async def send(packet: bytes, replies: int, gathered: bool) -> list[Any]:
        sent.append(packet)
        raise error

    batcher = Batcher(_InFlight())
    got = await asyncio.gather(
        *(batcher.gather(None, p, 1, send) for p in (b"a", b"b", b"c")), return_exceptions=True
    )
    assert sent == [b"abc"]  # one packet
    assert all(type(e) is type(error) and e.args == error.args for e in got), got
    if isinstance(error, redis.exceptions.RedisError):
        assert len({id(e) for e in got}) == 3 and error not in got
    else:
        assert all(e is error for e in got)
    await batcher.settle()


async def test_each_exchange_times_out_at_its_own_deadline_on_one_timer() -> None:
    """The wire's one timer expires each reader at its own deadline (a later deadline noted
    first, an earlier one after it), never a reader whose exchange ended, and is armed again
    for the next deadline after it fires."""
    deadlines = exchange.Deadlines()
    early, late, ended, next_ = (asyncio.StreamReader() for _ in range(4))
    began = time.monotonic()
    deadlines.start(late, 0.30)
    deadlines.start(early, 0.05)  # earlier than the one armed: armed again for it
    deadlines.start(ended, 0.05)
    deadlines.stop(ended)

    async def expired(reader: asyncio.StreamReader) -> float:
        """When the read waiting on ``reader`` was woken by its timeout."""
        with pytest.raises(redis.exceptions.TimeoutError):
            async with asyncio.timeout(2):  # a timer not armed again: a failure, not a hang
                await reader.read(1)
        return time.monotonic() - began

    assert 0.04 <= await expired(early) < 0.25
    assert late.exception() is None
    assert 0.29 <= await expired(late) < 0.6
    assert ended.exception() is None
    deadlines.start(next_, 0.05)  # nothing under way: the timer is armed anew
    assert 0.3 <= await expired(next_) < 0.9
    assert ended.exception() is None
    deadlines.stop(next_)

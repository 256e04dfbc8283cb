"""Redis restarted, down, hung or partitioned away: truthful verdicts, bounded errors, recovery.

One Redis of this module alone (the faults kill, stop and restart it). The
buffers use short timeouts from the URL (``socket_connect_timeout``,
``socket_timeout``), which is also how an operator tunes them.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from replaystore import ReplayBuffer, StorageError, UnknownSessionError, Verdict
from replaystore.testing import ServerHandle, TcpProxy, redis_server_binary, start_standalone
from tests.faults.conftest import at, behind_proxies
from tests.plugins.servers import RealServers

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

TIMEOUTS = "?socket_connect_timeout=0.5&socket_timeout=0.5"
HANG_GUARD = 10.0
"""Far above the configured timeouts: a call still running then is a hang, not a slow error."""


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    handle = start_standalone(redis_server_binary())
    yield handle
    handle.stop()


async def _warm(buf: ReplayBuffer, session: str) -> list[str]:
    """A session with events, and several pooled connections (a restart leaves them dead)."""
    await buf.open_session(session)
    ids = await buf.append_many(session, "q", [b"a", b"b", b"c"])
    await asyncio.gather(*(buf.resolve(session, ids[0]) for _ in range(8)))
    return ids


Operation = Callable[[ReplayBuffer, str, str], Awaitable[Any]]

# Every operation that needs the store, as (name, call with a session and a cursor).
OPERATIONS: list[tuple[str, Operation]] = [
    ("open_session", lambda b, s, c: b.open_session(s)),
    ("session_info", lambda b, s, c: b.session_info(s)),
    ("append", lambda b, s, c: b.append(s, "q", b"x")),
    ("append_many", lambda b, s, c: b.append_many(s, "q", [b"x", None])),
    ("resolve", lambda b, s, c: b.resolve(s, c)),
    ("resolve_and_replay", lambda b, s, c: b.resolve_and_replay(s, c)),
    ("close_session", lambda b, s, c: b.close_session(s)),
]


# -- restart without persistence ----------------------------------------------------------


IDEMPOTENT_FIRST_CALLS: list[tuple[str, Operation]] = [
    ("resolve", lambda b, s, c: b.resolve(s, c)),
    ("session_info", lambda b, s, c: b.session_info(s)),
    ("open_session", lambda b, s, c: b.open_session(s)),
    ("close_session", lambda b, s, c: b.close_session(s)),
    ("resolve_and_replay", lambda b, s, c: b.resolve_and_replay(s, c)),
]


@pytest.mark.parametrize(
    "first_call",
    [op for _, op in IDEMPOTENT_FIRST_CALLS],
    ids=[name for name, _ in IDEMPOTENT_FIRST_CALLS],
)
async def test_first_call_after_a_restart_succeeds(
    server: ServerHandle, prefix: str, first_call: Operation
) -> None:
    """No error on the connections a restart left dead in the pool.

    The restart runs in a thread, as it would elsewhere: the event loop is
    free meanwhile and sees its pooled connections being closed.
    """
    async with ReplayBuffer.from_url(server.url + TIMEOUTS, prefix=prefix) as buf:
        ids = await _warm(buf, "s")
        await asyncio.to_thread(server.restart)
        await first_call(buf, "s", ids[0])  # must not raise
        # And the store's answer is the truth after the restart: the session is gone.
        gone = await buf.resolve("s", ids[0])
        assert gone.verdict in (Verdict.UNKNOWN_SESSION, Verdict.FOREIGN_CURSOR), gone


async def test_first_append_after_a_restart_is_judged_not_an_error(
    server: ServerHandle, prefix: str
) -> None:
    """Even an append (never re-sent) gets a dead pooled connection replaced before it is sent."""
    async with ReplayBuffer.from_url(server.url + TIMEOUTS, prefix=prefix) as buf:
        await _warm(buf, "s")
        await asyncio.to_thread(server.restart)
        with pytest.raises(UnknownSessionError):
            await buf.append("s", "q", b"x")


async def test_first_call_right_after_a_restart_succeeds(server: ServerHandle, prefix: str) -> None:
    """The worst case: the restart happens while the event loop is blocked, so the
    pool cannot have noticed; the first idempotent call still must not fail."""
    async with ReplayBuffer.from_url(server.url + TIMEOUTS, prefix=prefix) as buf:
        ids = await _warm(buf, "s")
        server.restart()
        gone = await buf.resolve("s", ids[0])
        assert gone.verdict is Verdict.UNKNOWN_SESSION, gone


async def test_restart_old_cursors_fail_new_sessions_work_no_position_reused(
    server: ServerHandle, prefix: str
) -> None:
    async with (
        ReplayBuffer.from_url(server.url + TIMEOUTS, prefix=prefix) as buf,
        ReplayBuffer.from_url(server.url + TIMEOUTS, prefix=prefix) as other,
    ):
        old = await _warm(buf, "s")
        await _warm(other, "t")
        old_epoch = at(old[0])[0]
        await asyncio.to_thread(server.restart)

        for replica in (buf, other):
            gone = await replica.resolve("s", old[0])
            assert gone.verdict is Verdict.UNKNOWN_SESSION, gone
            assert gone.evidence.tombstone is None
        # New sessions work at once, on both replicas.
        fresh = await other.open_session("new")
        assert at(await other.append("new", "q", b"n1")) == (fresh.epoch, 1)
        replay = await buf.resolve_and_replay("new", str(fresh.origin))
        assert [e.payload for e in replay.events] == [b"n1"]
        # The old session id comes back under a new epoch: old cursors never resume into it.
        again = await buf.open_session("s")
        assert again.epoch != old_epoch
        new = await buf.append_many("s", "q", [b"A", b"B", b"C", b"D"])
        assert [at(eid) for eid in new] == [(again.epoch, p) for p in range(1, 5)]
        for cursor in [*old, f"{old_epoch}-0"]:
            probe = await other.resolve("s", cursor)
            assert probe.verdict is Verdict.FOREIGN_CURSOR, (cursor, probe)
            assert probe.events == []


# -- outage: down, hung, partitioned ----------------------------------------------------------


async def _every_operation_fails(buf: ReplayBuffer, session: str, cursor: str) -> None:
    """Each operation raises StorageError, none hangs.

    ``close_session`` targets a session of its own: a command sent to a hung
    server or into a partition may still run once the server answers again.
    """
    failed = []
    for name, op in OPERATIONS:
        target = f"{session}-closing" if name == "close_session" else session
        try:
            async with asyncio.timeout(HANG_GUARD):
                await op(buf, target, cursor)
        except StorageError:
            failed.append(name)
    assert failed == [name for name, _ in OPERATIONS]


async def test_redis_down_then_back(server: ServerHandle, prefix: str) -> None:
    async with ReplayBuffer.from_url(server.url + TIMEOUTS, prefix=prefix) as buf:
        ids = await _warm(buf, "s")
        (pid,) = server.pids()
        os.kill(pid, signal.SIGKILL)
        await _every_operation_fails(buf, "s", ids[0])
        server.restart()  # back, empty
        info = await buf.open_session("s")
        assert at(await buf.append("s", "q", b"back")) == (info.epoch, 1)
        assert (await buf.resolve("s", ids[0])).verdict is Verdict.FOREIGN_CURSOR


async def test_redis_hung_then_continues(server: ServerHandle, prefix: str) -> None:
    """A stopped process accepts connections and never answers: the read timeout bounds calls."""
    async with ReplayBuffer.from_url(server.url + TIMEOUTS, prefix=prefix) as buf:
        ids = await _warm(buf, "s")
        (pid,) = server.pids()
        os.kill(pid, signal.SIGSTOP)
        try:
            await _every_operation_fails(buf, "s", ids[0])
        finally:
            os.kill(pid, signal.SIGCONT)
        await _session_survived(buf, "s", ids)


async def test_partition_then_heals(server: ServerHandle, prefix: str) -> None:
    """A silent network (sockets open, nothing delivered), then the partition heals."""
    with TcpProxy([("127.0.0.1", server.ports[0])]) as proxy:
        async with ReplayBuffer.from_url(proxy.url() + TIMEOUTS, prefix=prefix) as buf:
            ids = await _warm(buf, "s")
            proxy.pause()
            try:
                await _every_operation_fails(buf, "s", ids[0])
            finally:
                proxy.resume()
            await _session_survived(buf, "s", ids)


async def test_snapshot_reply_stopping_halfway_is_a_timeout_then_a_retry(
    server: ServerHandle, prefix: str
) -> None:
    """A resume's pipelined read whose replies stop after the first one, the
    connection left open: the read gives up within the socket timeout and the
    resume is sent once more on another connection, exactly."""
    with TcpProxy([("127.0.0.1", server.ports[0])]) as proxy:
        async with ReplayBuffer.from_url(proxy.url() + TIMEOUTS, prefix=prefix) as buf:
            ids = await _warm(buf, "s")
            # The first reply (the bookkeeping's HMGET) whole, then nothing.
            backend: Any = buf.backend
            base = backend.key_base("s")
            tag = ids[0].split(".")[1]
            fields = ["epoch", "top", "floor", "count", "nseq", f"s:{tag}"]
            values = await backend.client.hmget(f"{base}:m", fields)
            first = b"*%d\r\n" % len(values) + b"".join(
                b"$-1\r\n" if v is None else b"$%d\r\n%s\r\n" % (len(v), v) for v in values
            )
            proxy.stall_reply_after(b"HMGET", keep=len(first))
            loop = asyncio.get_running_loop()
            began = loop.time()
            replay = await asyncio.wait_for(buf.resolve_and_replay("s", ids[0]), HANG_GUARD)
            took = loop.time() - began
            assert proxy.wait_dropped(0), "the stall must have happened"
            assert replay.verdict is Verdict.RESUMED, replay
            assert [e.payload for e in replay.events] == [b"b", b"c"]
            assert took < HANG_GUARD / 2, took


async def test_a_write_the_network_does_not_take_is_a_timeout(
    server: ServerHandle, prefix: str
) -> None:
    """A batch larger than the socket buffers, into a partition: the write
    itself has to wait, and gives up within the socket timeout (the socket
    takes most writes at once, untimed; only a write that waits is timed)."""
    with TcpProxy([("127.0.0.1", server.ports[0])]) as proxy:
        async with ReplayBuffer.from_url(
            proxy.url() + TIMEOUTS, prefix=prefix, max_payload=1 << 20
        ) as buf:
            ids = await _warm(buf, "s")
            proxy.pause()
            loop = asyncio.get_running_loop()
            began = loop.time()
            try:
                with pytest.raises(StorageError, match=r"(?i)timeout writing"):
                    async with asyncio.timeout(HANG_GUARD):
                        await buf.append_many("s", "q", [b"x" * (1 << 20)] * 64)
            finally:
                proxy.resume()
            assert loop.time() - began < HANG_GUARD / 2
            # The connection was dropped with the rest of the batch unsent: the
            # command never completes, so it is never run, not even once the
            # partition has healed and what was in flight has arrived.
            await asyncio.sleep(1.0)
            info = await buf.session_info("s")
            assert info is not None and info.high_water == 3, info
            replay = await buf.resolve_and_replay("s", ids[0])
            assert replay.verdict is Verdict.RESUMED, replay
            assert [e.payload for e in replay.events] == [b"b", b"c"]


async def test_cluster_partition_then_heals(real_servers: RealServers, prefix: str) -> None:
    """Every node of a cluster silent at once (the cluster itself stays healthy), then back."""
    with behind_proxies(real_servers.shared("cluster")) as (url, options, proxies):
        async with ReplayBuffer.from_url(url + TIMEOUTS, prefix=prefix, **options) as buf:
            ids = await _warm(buf, "s")
            for proxy in proxies:
                proxy.pause()
            try:
                await _every_operation_fails(buf, "s", ids[0])
            finally:
                for proxy in proxies:
                    proxy.resume()
            await _session_survived(buf, "s", ids)


async def test_cluster_unreachable_then_back(real_servers: RealServers, prefix: str) -> None:
    """Every connection to every node refused, then the nodes are reachable again."""
    with behind_proxies(real_servers.shared("cluster")) as (url, options, proxies):
        async with ReplayBuffer.from_url(url + TIMEOUTS, prefix=prefix, **options) as buf:
            ids = await _warm(buf, "s")
            upstreams = [list(proxy._upstreams) for proxy in proxies]
            for proxy in proxies:
                proxy.set_upstreams([])
                proxy.sever_all()
            try:
                await _every_operation_fails(buf, "s", ids[0])
            finally:
                for proxy, upstream in zip(proxies, upstreams, strict=True):
                    proxy.set_upstreams(upstream)
            await _session_survived(buf, "s", ids)


async def _session_survived(buf: ReplayBuffer, session: str, ids: list[str]) -> None:
    """After a hang or a partition the data is intact: old cursors resume, exactly.

    Whatever a failed call did on the server (a timed-out append may have run
    there) shows up as whole events after the cursor, never as a gap.
    """
    res = await buf.resolve_and_replay(session, ids[0])
    assert res.verdict is Verdict.RESUMED, res
    payloads = [e.payload for e in res.events]
    assert payloads[:2] == [b"b", b"c"]
    positions = [e.position for e in res.events]
    assert positions == list(range(2, 2 + len(positions)))
    try:
        await buf.append(session, "q", b"after")
    except UnknownSessionError:
        pytest.fail("the session must outlive a hang or a partition")


async def test_a_hung_redis_costs_each_call_at_most_its_stated_bound(
    server: ServerHandle, prefix: str
) -> None:
    """The README's bound: one socket timeout for an append without a key, at most
    2 x (connect + socket timeout) for a call that is sent once more."""
    connect, read = 0.5, 0.5
    repeated = 2 * (connect + read)
    async with ReplayBuffer.from_url(server.url + TIMEOUTS, prefix=prefix) as buf:
        ids = await _warm(buf, "s")
        bounds: list[tuple[str, Operation, float]] = [
            (name, op, read if name in ("append", "append_many") else repeated)
            for name, op in OPERATIONS
        ]
        bounds.append(
            ("keyed append", lambda b, s, c: b.append(s, "q", b"k", idempotency_key="k"), repeated)
        )
        (pid,) = server.pids()
        loop = asyncio.get_running_loop()
        took: dict[str, float] = {}

        async def timed(name: str, op: Operation) -> None:
            began = loop.time()
            with pytest.raises(StorageError):
                await asyncio.wait_for(op(buf, "s", ids[0]), HANG_GUARD)
            took[name] = loop.time() - began

        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.gather(*(timed(name, op) for name, op, _ in bounds))
        finally:
            os.kill(pid, signal.SIGCONT)
    slack = 0.3  # scheduling on a loaded machine
    over = {n: round(took[n], 2) for n, _, bound in bounds if took[n] > bound + slack}
    assert not over, f"past the stated bound: {over} (all: {took})"
    assert min(took.values()) >= read - 0.05, took

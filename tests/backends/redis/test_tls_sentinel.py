"""``rediss://`` (TLS) and ``redis+sentinel://`` URLs against real servers.

TLS: a throw-away CA and server certificate (made with ``openssl``) and a
redis-server that listens on a TLS port only. A verified connection, an
unverified one (``ssl_cert_reqs=none``) work end to end; plain text against
the TLS port and TLS without the CA fail fast with ``StorageError``.

Sentinel: a master and one sentinel (``redis-server <conf> --sentinel``)
watching it; the sentinel URL finds the master and the keys land there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import quote

import anyio
import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection
from redis.asyncio.sentinel import SentinelConnectionPool

from replaystore import ReplayBuffer, StorageError, Verdict
from replaystore.backends.coordination import coordination_of
from replaystore.cursor import sequence_tag
from replaystore.taskstore import new_task_id
from replaystore.testing.servers import (
    ServerHandle,
    TLSFiles,
    make_tls_files,
    redis_server_binary,
    start_sentinel,
    start_standalone,
    start_tls_standalone,
)

from ._support import bare, client_of

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

V = Verdict


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(tls_files: TLSFiles) -> Iterator[ServerHandle]:
    handle = start_tls_standalone(redis_server_binary(), tls_files)
    yield handle
    handle.stop()
    assert handle.pids() == []


@pytest.fixture
def sentinel() -> Iterator[tuple[ServerHandle, ServerHandle]]:
    """(master, sentinel): a standalone Redis and one sentinel monitoring it as 'mymaster'."""
    master = start_standalone(redis_server_binary(), "redis")
    try:
        watcher = start_sentinel(redis_server_binary(), master.ports[0], "mymaster")
    except BaseException:
        master.stop()
        raise
    yield master, watcher
    watcher.stop()
    master.stop()
    assert watcher.pids() == [] and master.pids() == []


async def _round_trip(buf: ReplayBuffer, s: str = "s") -> None:
    """Open, append, resume with exactly the missed events, then a failed resume tears down."""
    info = await buf.open_session(s)
    ids = await buf.append_many(s, "q", [b"one", b"two", None])
    ids.append(await buf.append(s, "q", b"four"))
    assert [bare(i) for i in ids] == [f"{info.epoch}-{p}" for p in (1, 2, 3, 4)]

    replay = await buf.resolve_and_replay(s, ids[0], "q")
    assert replay.verdict is V.RESUMED
    assert [(e.event_id, e.sequence, e.position, e.payload) for e in replay.events] == [
        (ids[1], "q", 2, b"two"),
        (ids[2], "q", 3, None),
        (ids[3], "q", 4, b"four"),
    ]
    assert replay.evidence.replayed == 3
    assert not replay.evidence.torn_down

    ahead = await buf.resolve_and_replay(s, f"{info.epoch}-9")
    assert ahead.verdict is V.AHEAD_OF_HIGH_WATER
    assert ahead.evidence.torn_down
    assert ahead.events == []
    gone = await buf.resolve(s, ids[0])
    assert gone.verdict is V.UNKNOWN_SESSION
    assert gone.evidence.tombstone is not None
    assert gone.evidence.tombstone.verdict is V.AHEAD_OF_HIGH_WATER
    assert await buf.session_info(s) is None


async def _keys(port: int, db: int, pattern: str) -> list[bytes]:
    """Keys on ``127.0.0.1:port`` read with a plain client (no TLS, no sentinel)."""
    admin = aioredis.Redis(port=port, db=db)
    try:
        return sorted(await admin.keys(pattern))
    finally:
        await admin.aclose()


async def _fails_fast(url: str, seconds: float = 5.0) -> StorageError:
    buf = ReplayBuffer.from_url(url)
    started = time.monotonic()
    try:
        with anyio.fail_after(seconds), pytest.raises(StorageError) as caught:
            async with buf:
                pass
    finally:
        await buf.aclose()
    assert time.monotonic() - started < seconds
    return caught.value


# -- rediss:// ---------------------------------------------------------------


async def test_rediss_verified_with_the_ca(
    tls_server: ServerHandle, tls_files: TLSFiles, prefix: str
) -> None:
    url = f"{tls_server.url}?ssl_ca_certs={quote(str(tls_files.ca))}&prefix={prefix}"
    with anyio.fail_after(10):
        async with ReplayBuffer.from_url(url) as buf:
            assert buf.backend.prefix == prefix  # type: ignore[attr-defined]
            assert client_of(buf).connection_pool.connection_class is SSLConnection
            await _round_trip(buf)
            # Still a live TLS session on the server after the teardown.
            assert await client_of(buf).ping() is True


async def test_rediss_with_hostname_localhost(
    tls_server: ServerHandle, tls_files: TLSFiles, prefix: str
) -> None:
    """The certificate's DNS name verifies too (ssl_check_hostname on)."""
    port = tls_server.ports[0]
    url = (
        f"rediss://localhost:{port}/0?ssl_ca_certs={quote(str(tls_files.ca))}"
        f"&ssl_check_hostname=true&prefix={prefix}"
    )
    with anyio.fail_after(10):
        async with ReplayBuffer.from_url(url) as buf:
            info = await buf.open_session("s")
            assert info.high_water == 0


async def test_rediss_without_verification(tls_server: ServerHandle, prefix: str) -> None:
    url = f"{tls_server.url}?ssl_cert_reqs=none&prefix={prefix}"
    with anyio.fail_after(10):
        async with ReplayBuffer.from_url(url) as buf:
            assert client_of(buf).connection_pool.connection_class is SSLConnection
            await _round_trip(buf)


async def test_plain_text_against_the_tls_port_is_a_storage_error(
    tls_server: ServerHandle,
) -> None:
    port = tls_server.ports[0]
    await _fails_fast(f"redis://127.0.0.1:{port}/0?socket_timeout=1&socket_connect_timeout=1")


async def test_rediss_without_the_ca_is_a_storage_error(tls_server: ServerHandle) -> None:
    """Verification on, the test CA unknown: the handshake fails, it does not hang."""
    port = tls_server.ports[0]
    error = await _fails_fast(
        f"rediss://127.0.0.1:{port}/0?socket_timeout=1&socket_connect_timeout=1"
    )
    assert "certificate verify failed" in str(error).lower()


# -- redis+sentinel:// -------------------------------------------------------


async def test_sentinel_url_finds_the_master(
    sentinel: tuple[ServerHandle, ServerHandle], prefix: str
) -> None:
    master, watcher = sentinel
    url = f"redis+sentinel://127.0.0.1:{watcher.ports[0]}/mymaster/0?prefix={prefix}"
    assert url == f"{watcher.url}?prefix={prefix}"
    with anyio.fail_after(10):
        async with ReplayBuffer.from_url(url) as buf:
            assert buf.backend.prefix == prefix  # type: ignore[attr-defined]
            assert isinstance(client_of(buf).connection_pool, SentinelConnectionPool)
            info = await buf.open_session("s")
            ids = await buf.append_many("s", "q", [b"a", b"b", b"c"])
            replay = await buf.resolve_and_replay("s", ids[0])
            assert replay.verdict is V.RESUMED
            assert [(e.event_id, e.payload) for e in replay.events] == [
                (ids[1], b"b"),
                (ids[2], b"c"),
            ]
            assert replay.evidence.epoch == info.epoch
            # The keys are on the master, read with a plain client.
            assert await _keys(master.ports[0], 0, f"{prefix}*") == [
                f"{prefix}{{s}}:i".encode(),
                f"{prefix}{{s}}:m".encode(),
                f"{prefix}{{s}}:q:{sequence_tag('q')}".encode(),
            ]
            await _round_trip(buf, "s2")


async def test_sentinel_url_db_and_credentials(
    sentinel: tuple[ServerHandle, ServerHandle], prefix: str
) -> None:
    """``/service/db`` selects the master's database; the password is the master's."""
    master, watcher = sentinel
    admin = aioredis.Redis(port=master.ports[0])
    try:
        await admin.execute_command("ACL", "SETUSER", "app", "on", ">secret", "~*", "+@all")
    finally:
        await admin.aclose()
    url = f"redis+sentinel://app:secret@127.0.0.1:{watcher.ports[0]}/mymaster/2?prefix={prefix}"
    with anyio.fail_after(10):
        async with ReplayBuffer.from_url(url) as buf:
            await buf.open_session("s")
            await buf.append("s", "q", b"x")
            me = (await client_of(buf).execute_command("CLIENT", "INFO")).decode()
            assert " user=app " in me
            assert " db=2 " in me
    in_db2 = await _keys(master.ports[0], 2, f"{prefix}*")
    assert {f"{prefix}{{s}}:i".encode(), f"{prefix}{{s}}:m".encode()} <= set(in_db2)
    assert await _keys(master.ports[0], 0, f"{prefix}*") == []


async def test_sentinel_unknown_service_is_a_storage_error(
    sentinel: tuple[ServerHandle, ServerHandle],
) -> None:
    _, watcher = sentinel
    await _fails_fast(f"redis+sentinel://127.0.0.1:{watcher.ports[0]}/nosuchmaster/0")


async def test_sentinel_connections_closed_with_the_buffer(
    sentinel: tuple[ServerHandle, ServerHandle], prefix: str
) -> None:
    """aclose() closes the connection to the sentinel too, not only the master's pool."""
    _, watcher = sentinel
    probe = aioredis.Redis(port=watcher.ports[0])

    async def others() -> int:
        # CLIENT LIST on the sentinel, minus this probe's own connection.
        return len(await probe.client_list()) - 1

    try:
        with anyio.fail_after(10):
            assert await others() == 0
            async with ReplayBuffer.from_url(f"{watcher.url}?prefix={prefix}") as buf:
                await buf.open_session("s")
                assert await others() >= 1
            # The server drops a closed connection from its list a moment later.
            for _ in range(100):  # up to ~2 s
                if not await others():
                    break
                await anyio.sleep(0.02)
            assert await others() == 0, "a connection to the sentinel outlived the buffer"
    finally:
        await probe.aclose()


async def test_tasks_through_a_sentinel_url_live_on_the_master(
    sentinel: tuple[ServerHandle, ServerHandle], prefix: str
) -> None:
    """A sentinel URL's task store: records, answers and nudges on the master."""
    master, watcher = sentinel
    url = f"{watcher.url}?prefix={prefix}"
    heard: list[str] = []
    with anyio.fail_after(20):
        async with ReplayBuffer.from_url(url) as runner_buf, ReplayBuffer.from_url(url) as other:
            runner_side = coordination_of(runner_buf.backend).task_store()
            client_side = coordination_of(other.backend).task_store()
            task_id = new_task_id()
            await client_side.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
            [key] = await runner_side.ask(task_id, "r1", [{"method": "elicitation/create"}]) or []
            async with runner_side.nudges("r1", heard.append):
                assert await client_side.respond(task_id, {key: {"action": "accept"}})
                while not heard:  # noqa: ASYNC110 - the nudge, polled
                    await anyio.sleep(0.02)
            assert heard == [task_id]
            beat = await runner_side.beat(task_id, "r1", 5)
            assert beat is not None and beat.answers == {key: {"action": "accept"}}
            assert await runner_side.finish(task_id, "completed", result={"content": []})
            done = await client_side.get(task_id)
            assert done is not None and done.status == "completed"
            stored = await _keys(master.ports[0], 0, f"{prefix}*task:{task_id}*")
            assert f"{prefix}{{task:{task_id}}}:task".encode() in stored

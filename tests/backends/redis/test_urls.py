"""Storage URLs on real servers: credentials, database, prefix, unix sockets, refusals."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import anyio
import pytest
import redis
import redis.asyncio as aioredis

from replaystore import ReplayBuffer, StorageError, UnsupportedURLError, Verdict
from replaystore.cursor import sequence_tag
from replaystore.testing.servers import ServerHandle, find_free_port, redis_server_binary

from ._support import client_of

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]


@pytest.fixture(scope="module")
def acl_server(scratch_server: ServerHandle) -> ServerHandle:
    """The module's own server, with two ACL users (one with a password full of URL syntax)."""
    admin = redis.Redis(port=scratch_server.ports[0])
    try:
        admin.execute_command("ACL", "SETUSER", "user", "on", ">pass", "~*", "+@all")
        admin.execute_command("ACL", "SETUSER", "odd", "on", ">p@ss:w/rd%?#", "~*", "+@all")
    finally:
        admin.close()
    return scratch_server


async def _keys(port: int, db: int, pattern: str) -> list[bytes]:
    admin = aioredis.Redis(port=port, db=db)
    try:
        return sorted(await admin.keys(pattern))
    finally:
        await admin.aclose()


async def test_user_password_db_and_prefix_from_url(acl_server: ServerHandle, prefix: str) -> None:
    port = acl_server.ports[0]
    url = f"redis://user:pass@127.0.0.1:{port}/3?prefix={prefix}"
    async with ReplayBuffer.from_url(url) as buf:
        assert buf.backend.prefix == prefix  # type: ignore[attr-defined]
        info = await buf.open_session("s")
        ids = await buf.append_many("s", "q", [b"1", b"2"])
        replay = await buf.resolve_and_replay("s", ids[0])
        assert [e.payload for e in replay.events] == [b"2"]
        me = (await client_of(buf).execute_command("CLIENT", "INFO")).decode()
        assert " user=user " in me
        assert " db=3 " in me
    assert await _keys(port, 3, f"{prefix}*") == [
        f"{prefix}{{s}}:i".encode(),
        f"{prefix}{{s}}:m".encode(),
        f"{prefix}{{s}}:q:{sequence_tag('q')}".encode(),
    ]
    assert await _keys(port, 0, f"{prefix}*") == []
    assert info.epoch == replay.evidence.epoch


async def test_percent_encoded_password(acl_server: ServerHandle, prefix: str) -> None:
    port = acl_server.ports[0]
    url = f"redis://odd:{quote('p@ss:w/rd%?#', safe='')}@127.0.0.1:{port}/0?prefix={prefix}"
    async with ReplayBuffer.from_url(url) as buf:
        await buf.open_session("s")
        me = (await client_of(buf).execute_command("CLIENT", "INFO")).decode()
        assert " user=odd " in me


@pytest.mark.parametrize(
    "userinfo", ["user:wrong", "nobody:pass", ":wrong", "user:"], ids=lambda u: u or "none"
)
async def test_bad_credentials_fail_fast_with_storage_error(
    acl_server: ServerHandle, userinfo: str
) -> None:
    await _require_auth(acl_server)
    url = f"redis://{userinfo}@127.0.0.1:{acl_server.ports[0]}/0"
    buf = ReplayBuffer.from_url(url)
    with anyio.fail_after(5):
        with pytest.raises(StorageError):
            async with buf:
                pass
        with pytest.raises(StorageError):  # and every later call, too
            await buf.open_session("s")
    await buf.aclose()


async def _require_auth(handle: ServerHandle) -> None:
    """Make the default user need a password, so 'no user' cannot log in either."""
    admin = aioredis.Redis(port=handle.ports[0], username="user", password="pass")
    try:
        await admin.execute_command("ACL", "SETUSER", "default", "on", "resetpass", ">adminpw")
    finally:
        await admin.aclose()


async def test_nobody_listening_is_a_storage_error() -> None:
    buf = ReplayBuffer.from_url(f"redis://127.0.0.1:{find_free_port()}/0")
    with anyio.fail_after(5), pytest.raises(StorageError):
        async with buf:
            pass
    await buf.aclose()


async def test_prefix_option_beats_the_url_query(redis_server: ServerHandle, prefix: str) -> None:
    """Regression: the query's prefix used to reach redis-py as a connection argument."""
    url = f"{redis_server.url}?prefix=ignored-{prefix}"
    async with ReplayBuffer.from_url(url, prefix=prefix) as buf:
        await buf.open_session("s")
    assert await _keys(redis_server.ports[0], 0, f"{prefix}*") == [f"{prefix}{{s}}:m".encode()]
    assert await _keys(redis_server.ports[0], 0, f"ignored-{prefix}*") == []


@pytest.fixture(scope="module")
def unix_server() -> Iterator[Path]:
    """A redis-server listening on a unix socket only (port 0), in a short temp dir."""
    # Unix socket paths are limited to ~107 bytes: keep the directory short.
    workdir = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    sock = workdir / "redis.sock"
    log = (workdir / "server.log").open("wb")
    args = [
        redis_server_binary(),
        "--port", "0",
        "--unixsocket", str(sock),
        "--unixsocketperm", "700",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(workdir),
    ]  # fmt: skip
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError((workdir / "server.log").read_text())
            try:
                with redis.Redis(unix_socket_path=str(sock)) as probe:
                    if sock.exists() and probe.ping():
                        break
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("unix-socket redis did not start")
            time.sleep(0.02)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("scheme", ["redis+unix", "unix"])
async def test_unix_socket_url(unix_server: Path, prefix: str, scheme: str) -> None:
    url = f"{scheme}://{unix_server}?db=2&prefix={prefix}"
    async with ReplayBuffer.from_url(url) as a, ReplayBuffer.from_url(url) as b:
        await a.open_session("s")
        ids = await a.append_many("s", "q", [b"x", b"y"])
        replay = await b.resolve_and_replay("s", ids[0])
        assert replay.verdict is Verdict.RESUMED
        assert [e.payload for e in replay.events] == [b"y"]
    admin = aioredis.Redis(unix_socket_path=str(unix_server), db=2)
    try:
        assert sorted(await admin.keys(f"{prefix}*")) == [
            f"{prefix}{{s}}:i".encode(),
            f"{prefix}{{s}}:m".encode(),
            f"{prefix}{{s}}:q:{sequence_tag('q')}".encode(),
        ]
    finally:
        await admin.aclose()


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("redis://127.0.0.1:6379/0?prefix=app{1}:", {}),
        ("redis://127.0.0.1:6379/0?prefix=app%7B1:", {}),
        ("redis://127.0.0.1:6379/0?prefix=app%7D:", {}),
        ("redis://127.0.0.1:6379/0", {"prefix": "a{b}:"}),
        ("redis+cluster://127.0.0.1:7000?prefix=x}:", {}),
        ("redis+unix:///tmp/none.sock?prefix={", {}),
        ("mongodb://127.0.0.1:27017/0", {}),
        ("rediss+unix:///tmp/none.sock", {}),
        ("127.0.0.1:6379", {}),
        ("redis://127.0.0.1:6379/0", {"decode_responses": True}),
        ("redis+cluster://127.0.0.1:7000", {"decode_responses": True}),
        ("redis://127.0.0.1:notaport/0", {}),
        ("redis+cluster://", {}),
        ("redis+sentinel://127.0.0.1:26379", {}),
    ],
)
def test_refused_urls(url: str, options: dict[str, object]) -> None:
    with pytest.raises(UnsupportedURLError):
        ReplayBuffer.from_url(url, **options)  # type: ignore[arg-type]


async def test_unknown_query_option_is_refused(redis_server: ServerHandle) -> None:
    """A typo in a query option fails at from_url, naming the option."""
    with pytest.raises(UnsupportedURLError, match="socket_timout"):
        ReplayBuffer.from_url(f"{redis_server.url}?socket_timout=1")
    async with ReplayBuffer.from_url(f"{redis_server.url}?socket_timeout=1&prefix=ok:") as buf:
        info = await buf.open_session("s")
        assert info.high_water == 0


async def test_a_database_past_the_servers_count_says_so(redis_server: ServerHandle) -> None:
    """Redis answered and refused the database: not "cannot reach redis"."""
    buf = ReplayBuffer.from_url(f"redis://127.0.0.1:{redis_server.ports[0]}/99")
    with anyio.fail_after(5), pytest.raises(StorageError) as caught:
        async with buf:
            pass
    await buf.aclose()
    assert "cannot reach" not in str(caught.value)
    assert "refused" in str(caught.value) and "DB index is out of range" in str(caught.value)


@pytest.mark.parametrize("path", ["/abc", "/0/extra"])
async def test_a_path_that_is_no_database_number_is_refused(
    redis_server: ServerHandle, path: str
) -> None:
    """redis-py would use database 0 for these, silently."""
    with pytest.raises(UnsupportedURLError, match="database number"):
        ReplayBuffer.from_url(f"redis://127.0.0.1:{redis_server.ports[0]}{path}")

"""Every Redis key and channel name, byte for byte, for the prefix ``rs`` and the session ``s1``.

The names are the stored format: a Redis written by one version must stay
readable by the next, and replicas of two versions share one store during a
rolling upgrade. Each name is checked where the code that uses it builds it.
"""

from __future__ import annotations

import uuid

import anyio
import pytest
import redis.asyncio as aioredis

from replaystore import ReplayBuffer, Retention
from replaystore.backends.redis import RedisBackend, keys
from replaystore.backends.redis.coordination import OnRedis
from replaystore.backends.redis.coordination.bus import RedisBus
from replaystore.backends.redis.coordination.registry import RedisRegistry
from replaystore.backends.redis.coordination.tasks import RedisTaskStore
from replaystore.backends.redis.teardown import Teardown
from replaystore.commands.demo import _delete_keys
from replaystore.cursor import sequence_tag
from replaystore.mcp.request_state import StoreKeyRing
from replaystore.testing.servers import ServerHandle

pytestmark = pytest.mark.anyio

SESSION_KEYS = ["rs{s1}:m", "rs{s1}:i", "rs{s1}:g", "rs{s1}:t", "rs{s1}:k", "rs{s1}:k2", "rs{s1}:x"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend() -> RedisBackend:
    """A backend on a client that never connects: building names needs no server."""
    return RedisBackend(Retention(), aioredis.Redis(), prefix="rs")


@pytest.fixture
def on_redis(backend: RedisBackend) -> OnRedis:
    return backend.coordination()


def test_a_session_s_keys(backend: RedisBackend) -> None:
    assert backend.key_base("s1") == "rs{s1}"
    # braces would cut the cluster hash tag short: such ids are written as hex
    assert backend.key_base("a{b}") == "rs{ 617b627d}"
    assert backend._keys("s1", ["T"]) == [*SESSION_KEYS, "rs{s1}:q:T"]
    lean_keys, _ = backend._operands("append_lean", "s1", "seq", "T")
    assert lean_keys == ["rs{s1}:m", "rs{s1}:i", "rs{s1}:q:T"]
    full_keys, _ = backend._operands("append", "s1", "seq", "T")
    assert full_keys == [*SESSION_KEYS, "rs{s1}:q:T"]


def test_the_fast_read_s_keys(backend: RedisBackend) -> None:
    _, head, _ = backend._fast.read("s1", "T", None)
    assert b"$5\r\nHMGET\r\n$8\r\nrs{s1}:m\r\n" in head
    assert b"$6\r\nLRANGE\r\n$10\r\nrs{s1}:q:T\r\n" in head


async def test_a_teardown_s_keys(backend: RedisBackend) -> None:
    reads = Teardown("rs{s1}", "e", ("none", None), "{", 1000, "n").reads()
    assert reads == (
        b"*2\r\n$7\r\nHGETALL\r\n$8\r\nrs{s1}:m\r\n*2\r\n$8\r\nSMEMBERS\r\n$8\r\nrs{s1}:g\r\n"
    )
    leftovers = backend._leftovers
    backend._later("s1", [b"U", b"T", b"T"])  # the lists of a torn-down session, for later
    try:
        assert leftovers._pending == [("rs{s1}:m", ["rs{s1}:q:T", "rs{s1}:q:U"])]
    finally:
        assert leftovers._timer is not None
        leftovers._timer.cancel()


def test_the_store_marker(backend: RedisBackend, on_redis: OnRedis) -> None:
    assert backend.marker.key == "rs{store}:era"
    assert on_redis.marker is backend.marker  # one marker per process and store, every part


def test_the_registry_s_keys(on_redis: OnRedis) -> None:
    registry = on_redis.registry()
    assert isinstance(registry, RedisRegistry)
    assert registry._record("s1") == "rs{s1}:mcp"
    assert registry._lease("s1", "st") == "rs{s1}:mcp:lease:st"
    assert registry._end("s1", "st") == "rs{s1}:mcp:end:st"


def test_the_bus_channels(on_redis: OnRedis) -> None:
    def handler(*_: object) -> None: ...

    bus = on_redis.bus("r1", handler)
    assert isinstance(bus, RedisBus)
    assert bus._channel("s1") == "rsmcp:s:s1"
    assert bus._all == "rsmcp:all"
    assert bus._mine == "rsmcp:r:r1"


def test_the_listen_keys(on_redis: OnRedis) -> None:
    log = on_redis.listen_events(keep=10, block=None)
    assert [log._stream, log._counter] == ["rs{listen}:events", "rs{listen}:count"]


def test_the_task_keys(on_redis: OnRedis) -> None:
    store = on_redis.task_store(namespace="app")
    assert isinstance(store, RedisTaskStore)
    assert store.keys("t1") == [
        "rs{task:app:t1}:task",
        "rs{task:app:t1}:in",
        "rs{task:app:t1}:ans",
        "rs{task:app:t1}:ev",
    ]
    assert store._index() == "rs{tasks:app}:running"
    assert store._nudge_prefix() == "rs{tasks:app}:nudge:"
    bare = on_redis.task_store()
    assert isinstance(bare, RedisTaskStore)
    assert bare.keys("t1")[3] == "rs{task:t1}:ev"
    assert bare._index() == "rs{tasks}:running"
    assert bare._nudge_prefix() == "rs{tasks}:nudge:"


def test_the_names_module_spells_each_name_as_its_users_do() -> None:
    """``keys.py`` on its own: the names above, and those built only next to a server."""
    base = keys.base("rs", "s1")
    assert base == "rs{s1}"
    assert keys.session_keys(base, ["T"]) == [*SESSION_KEYS, "rs{s1}:q:T"]
    assert keys.teardown_keys(base, ["T"]) == [
        *(k for k in SESSION_KEYS if k != "rs{s1}:t"),
        "rs{s1}:q:T",
    ]
    assert (keys.meta(base), keys.run_index(base), keys.swept(base), keys.tombstone(base)) == (
        "rs{s1}:m",
        "rs{s1}:i",
        "rs{s1}:g",
        "rs{s1}:t",
    )
    assert keys.sequence(base, "T") == "rs{s1}:q:T"
    assert keys.registry(base) == "rs{s1}:mcp"
    assert keys.registry_lease(base, "st") == "rs{s1}:mcp:lease:st"
    assert keys.registry_end(base, "st") == "rs{s1}:mcp:end:st"
    assert keys.session_channel("rs", "s1") == "rsmcp:s:s1"
    assert keys.all_channel("rs") == "rsmcp:all"
    assert keys.replica_channel("rs", "r1") == "rsmcp:r:r1"
    assert keys.probe_channel("rs", "r1") == "rsmcp:r:probe.r1"
    assert keys.request_state("rs") == "rs{request-state}:key"
    assert keys.store_marker("rs") == "rs{store}:marker"
    assert keys.store_era("rs") == "rs{store}:era"
    assert keys.request_state_used("rs", "ab12") == "rs{request-state:ab12}:used"
    assert keys.listen(lambda name: keys.base("rs", name)) == (
        "rs{listen}:events",
        "rs{listen}:count",
    )
    # a SCAN pattern: the base's glob characters match themselves only
    assert keys.matching("r*s{s?1}") == "r\\*s{s\\?1}*"
    assert keys.DEFAULT_PREFIX == "replaystore:"


# ---------------------------------------------------------------- names used only on a server


@pytest.fixture
def prefix() -> str:
    """A prefix of this test's own: the server is shared with other tests."""
    return f"t{uuid.uuid4().hex[:8]}rs"


async def test_what_a_session_stores(redis_server: ServerHandle, prefix: str) -> None:
    buf = ReplayBuffer.from_url(f"{redis_server.url}?prefix={prefix}")
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        await buf.open_session("s1")
        await buf.append("s1", "main", b"x")
        stored = sorted([k.decode() async for k in client.scan_iter(match=f"{prefix}*")])
        assert stored == sorted(
            [f"{prefix}{{s1}}:m", f"{prefix}{{s1}}:i", f"{prefix}{{s1}}:q:{sequence_tag('main')}"]
        )
    finally:
        for key in await client.keys(f"{prefix}*"):
            await client.delete(key)
        await buf.aclose()
        await client.aclose()


async def test_the_demo_deletes_every_key_of_its_session(
    redis_server: ServerHandle, prefix: str
) -> None:
    buf = ReplayBuffer.from_url(f"{redis_server.url}?prefix={prefix}")
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        for session in ("s1", "s10"):  # s10's keys start with s1's name, not with its base
            await buf.open_session(session)
            await buf.append(session, "main", b"x")
        await _delete_keys(buf, "s1")
        left = sorted([k.decode() async for k in client.scan_iter(match=f"{prefix}*")])
        assert left and all(key.startswith(f"{prefix}{{s10}}") for key in left)
    finally:
        for key in await client.keys(f"{prefix}*"):
            await client.delete(key)
        await buf.aclose()
        await client.aclose()


async def test_the_request_state_key(redis_server: ServerHandle, prefix: str) -> None:
    buf = ReplayBuffer.from_url(f"{redis_server.url}?prefix={prefix}")
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        ring = StoreKeyRing()
        ring.bind(buf)
        await ring.load()
        assert await client.exists(f"{prefix}{{request-state}}:key") == 1
    finally:
        await client.delete(f"{prefix}{{request-state}}:key")
        await buf.aclose()
        await client.aclose()


async def test_the_preflight_probe_channel(redis_server: ServerHandle, prefix: str) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(f"{prefix}mcp:r:probe.r1")
        await pubsub.get_message(timeout=1)  # the subscription's confirmation
        await OnRedis(client, prefix, lambda s: f"{prefix}{{{s}}}").probe("r1")
        with anyio.fail_after(5):
            message = None
            while message is None:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
        assert message["channel"] == f"{prefix}mcp:r:probe.r1".encode()
    finally:
        await pubsub.aclose()
        await client.aclose()

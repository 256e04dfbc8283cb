"""The key sealing ``requestState`` in a real Redis: derived from a secret, its loss told.

One Redis of this module alone (its ``maxmemory`` and eviction policy are
changed on purpose, then restored). What is checked: with an operator's
secret, what Redis holds does not open (nor forge) a token, and every
replica given the secret opens it; a key really evicted (``allkeys-lru``)
is told in an error naming that policy and put back as it was, so tokens
sealed before still open everywhere; a write refused for memory names the
eviction policy Redis runs, not a fixed one. And the marks of used tokens:
recorded once, the answer kept beside them (memory and Redis alike).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState

from replaystore import ReplayBuffer
from replaystore.backends.coordination import coordination_of
from replaystore.backends.redis import keys
from replaystore.errors import StorageError
from replaystore.mcp.request_state import SECRET_VARIABLE, Secret, StoreKeyRing
from replaystore.testing.servers import ServerHandle

pytestmark = pytest.mark.anyio

SECRET = "9f2c4e7a1b3d5f6081a2c3e4f5061728394a5b6c7d8e9f00"  # an operator's secret


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def prefix() -> str:
    return f"rsk-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
async def buffer(scratch_server: ServerHandle, prefix: str) -> AsyncIterator[ReplayBuffer]:
    async with ReplayBuffer.from_url(f"{scratch_server.url}?prefix={prefix}") as opened:
        yield opened


@pytest.fixture
async def admin(scratch_server: ServerHandle) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(scratch_server.url)
    try:
        yield client
    finally:
        await client.config_set("maxmemory", 0)
        await client.config_set("maxmemory-policy", "noeviction")
        await client.aclose()


async def _ring(buffer: ReplayBuffer, secret: Secret | None = None) -> StoreKeyRing:
    ring = StoreKeyRing(secret=secret)
    ring.bind(buffer)
    await ring.load()
    return ring


async def test_with_a_secret_what_redis_holds_neither_opens_nor_forges_a_token(
    buffer: ReplayBuffer, prefix: str, admin: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sealer = await _ring(buffer, secret=SECRET)
    assert sealer.derived
    token = sealer.seal(b"round 2")
    stored = await admin.get(keys.request_state(prefix))
    from_redis = AESGCMRequestStateCodec([stored])
    with pytest.raises(InvalidRequestState):
        from_redis.unseal(token)
    forged = from_redis.seal(b"forged")
    monkeypatch.setenv(SECRET_VARIABLE, SECRET)  # another replica, given it by the environment
    other = await _ring(buffer)
    assert other.unseal(token) == b"round 2"
    with pytest.raises(InvalidRequestState):
        other.unseal(forged)
    with pytest.raises(InvalidRequestState):  # a replica without the secret opens nothing
        (await _ring(buffer, secret=[])).unseal(token)
    with pytest.raises(ValueError, match="at least 32 bytes"):
        StoreKeyRing(secret="short")


async def test_an_evicted_key_is_told_naming_the_policy_and_put_back_as_it_was(
    buffer: ReplayBuffer, prefix: str, admin: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    ring = await _ring(buffer, secret=SECRET)
    token = ring.seal(b"round 2")
    key = keys.request_state(prefix)
    await admin.config_set("maxmemory-policy", "allkeys-lru")
    await admin.config_set("maxmemory", 1)
    with pytest.raises(aioredis.ResponseError):  # Redis evicts every key it can, then refuses
        await admin.set(f"{key}:filler", "x")
    assert await admin.exists(key) == 0  # really evicted
    used = (await admin.info("memory"))["used_memory"]
    await admin.config_set("maxmemory", used + 16 * 2**20)  # room again, still evicting
    with caplog.at_level(logging.ERROR, logger="replaystore.mcp.request_state"):
        await ring.load()
    told = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(told) == 1 and "allkeys-lru" in told[0], told
    assert await admin.exists(key) == 1
    # Put back as it was: a replica starting now opens what was sealed before.
    assert (await _ring(buffer, secret=SECRET)).unseal(token) == b"round 2"


async def test_a_write_refused_for_memory_names_the_eviction_policy_redis_runs(
    buffer: ReplayBuffer, admin: aioredis.Redis
) -> None:
    coordination = coordination_of(buffer.backend)
    await admin.config_set("maxmemory-policy", "volatile-ttl")
    await admin.config_set("maxmemory", 1)
    assert "volatile-ttl" in str(await coordination.eviction_warning())  # what a replica reads
    tasks = coordination.task_store(namespace="rsk")
    with pytest.raises(StorageError) as refused:
        await tasks.create("t" * 24, runner="r", lease=5.0, ttl_ms=60_000)
    assert refused.value.kind == "oom"
    assert "volatile-ttl" in str(refused.value), refused.value
    assert "noeviction" not in str(refused.value), refused.value


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_token_is_recorded_once_and_its_answer_kept_for_its_repeats(
    kind: str, buffer: ReplayBuffer, prefix: str
) -> None:
    store = ReplayBuffer.from_url(f"memory://{prefix}") if kind == "memory" else buffer
    coordination = coordination_of(store.backend)
    assert await coordination.first_use("d1", 5.0) is None  # the first: it runs
    assert await coordination.first_use("d1", 5.0) == ""  # running: nothing to give again
    await coordination.keep_answer("d1", '{"content":[]}', 5.0)
    assert await coordination.first_use("d1", 5.0) == '{"content":[]}'
    await coordination.keep_answer("d2", "never recorded", 5.0)  # kept only beside a mark
    assert await coordination.first_use("d2", 5.0) is None

"""Backend selection by URL scheme, and third-party registration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from replaystore import (
    Backend,
    Cursor,
    InvalidInputError,
    ReplayBuffer,
    Resumption,
    Retention,
    SessionInfo,
    UnsupportedURLError,
    register_backend,
)
from replaystore.backends import registered_schemes
from replaystore.backends.memory import MemoryBackend
from replaystore.backends.redis import RedisBackend


def test_memory_is_the_default() -> None:
    assert isinstance(ReplayBuffer.from_url().backend, MemoryBackend)
    assert isinstance(ReplayBuffer.from_url("memory://").backend, MemoryBackend)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://u:p@127.0.0.1:6380/2?prefix=x:",
        "redis+unix:///tmp/redis.sock",
        "unix:///tmp/redis.sock?db=1",
        "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
        "redis+sentinel://127.0.0.1:26379/mymaster/0",
    ],
)
def test_redis_schemes_build_without_connecting(url: str) -> None:
    backend = ReplayBuffer.from_url(url).backend
    assert isinstance(backend, RedisBackend)


def test_prefix_from_query_or_option() -> None:
    from_query = ReplayBuffer.from_url("redis://127.0.0.1/0?prefix=app1:").backend
    from_option = ReplayBuffer.from_url("redis://127.0.0.1/0", prefix="app2:").backend
    assert isinstance(from_query, RedisBackend) and from_query.prefix == "app1:"
    assert isinstance(from_option, RedisBackend) and from_option.prefix == "app2:"
    assert from_query.key_base("S") == "app1:{S}"
    assert from_query._keys("S")[:4] == [f"app1:{{S}}:{k}" for k in "migt"]


@pytest.mark.parametrize(
    "url",
    ["", "nonsense", "ftp://x", "memory://a/b", "memory://?x=1", "redis+sentinel://127.0.0.1:1"],
)
def test_bad_urls_raise_a_clear_error(url: str) -> None:
    with pytest.raises(UnsupportedURLError):
        ReplayBuffer.from_url(url)


def test_prefix_with_hash_tag_braces_is_refused() -> None:
    with pytest.raises(UnsupportedURLError):
        ReplayBuffer.from_url("redis://127.0.0.1/0", prefix="a{b}:")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_events": 0},
        {"max_events": True},
        {"max_age": -1},
        {"max_age": float("nan")},
        {"session_ttl": float("inf")},
        {"max_payload": 0},
    ],
)
def test_bad_retention_raises(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        ReplayBuffer.from_url("memory://", **kwargs)


class _RecordingBackend(Backend):
    schemes = ("recording",)

    @classmethod
    def from_url(cls, url: str, retention: Retention, **options: Any) -> Backend:
        backend = cls(retention)
        backend.url = url  # type: ignore[attr-defined]
        return backend

    async def open_session(self, session: str) -> SessionInfo:
        return SessionInfo(session, "0" * 12, 1, 0, 0)

    async def append(
        self, session: str, sequence: str, payloads: Sequence[bytes | None]
    ) -> tuple[str, int]:
        return "0" * 12, 1

    async def resolve(
        self,
        session: str,
        cursor: Cursor | None,
        raw_cursor: str,
        sequence: str | None,
        *,
        replay: bool,
        teardown: bool,
    ) -> Resumption:
        raise NotImplementedError

    async def session_info(self, session: str) -> SessionInfo | None:
        return None

    async def close_session(self, session: str, *, tombstone_ttl: float | None = None) -> bool:
        return False


def test_third_party_backend_registers_its_scheme() -> None:
    register_backend(_RecordingBackend)
    assert "recording" in registered_schemes()
    buf = ReplayBuffer.from_url("recording://somewhere", max_events=3)
    assert isinstance(buf.backend, _RecordingBackend)
    assert buf.backend.url == "recording://somewhere"  # type: ignore[attr-defined]
    assert buf.retention.max_events == 3


def test_query_options_reach_cluster_and_sentinel_clients() -> None:
    cluster: Any = ReplayBuffer.from_url(
        "redis+cluster://127.0.0.1:7000?socket_timeout=1.5"
    ).backend
    assert cluster.client.nodes_manager.connection_kwargs["socket_timeout"] == 1.5
    sentinel: Any = ReplayBuffer.from_url(
        "redis+sentinel://u:pw@127.0.0.1:26379/svc/2?socket_timeout=2.5"
    ).backend
    pool = sentinel.client.connection_pool
    assert pool.connection_kwargs["socket_timeout"] == 2.5
    assert pool.connection_kwargs["password"] == "pw"
    assert pool.connection_kwargs["db"] == 2
    assert pool.sentinel_manager.sentinel_kwargs["socket_timeout"] == 2.5


@pytest.mark.parametrize(
    "kwargs", [{"socket_timeout": 1}, {"prefix": "app:"}, {"bogus": 1}], ids=lambda k: next(iter(k))
)
def test_memory_refuses_options_it_does_not_take(kwargs: dict[str, Any]) -> None:
    """A Redis option on memory:// is named, not a TypeError from a constructor."""
    with pytest.raises(UnsupportedURLError, match=f"memory://.*{next(iter(kwargs))}"):
        ReplayBuffer.from_url("memory://", **kwargs)


def test_a_buffer_needs_a_backend_and_a_real_bool() -> None:
    with pytest.raises(InvalidInputError, match="from_url"):
        ReplayBuffer("memory://")  # type: ignore[arg-type]
    backend = ReplayBuffer.from_url().backend
    for value in ("no", 0, None):
        with pytest.raises(InvalidInputError, match="teardown_on_failure"):
            ReplayBuffer(backend, teardown_on_failure=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="teardown_on_failure"):
        ReplayBuffer.from_url("memory://", teardown_on_failure="no")  # type: ignore[arg-type]
    assert ReplayBuffer(backend, teardown_on_failure=False).teardown_on_failure is False

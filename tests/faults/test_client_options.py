"""The connection bounds every Redis client gets, and how a URL or a keyword changes them.

Built without connecting (redis-py connects lazily), so these run without a
server; the fault tests show what the bounds do against real ones.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio
import redis.exceptions

from replaystore import UnsupportedURLError
from replaystore.backends.redis.client import build_client


def _client(url: str, **options: Any) -> Any:
    client, _, owned = build_client(url, **options)
    assert owned
    return client


def test_standalone_defaults() -> None:
    pool = _client("redis://127.0.0.1:6390/0").connection_pool
    assert pool.connection_kwargs["socket_connect_timeout"] == 1.0
    assert pool.connection_kwargs["socket_timeout"] == 5.0
    assert pool.max_connections == 128
    assert pool.timeout == 10.0
    # A connection Redis closed is tested and replaced at check-out.
    assert not pool.maint_notifications_enabled()
    assert pool.make_connection().retry.get_retries() == 0, "no command is ever re-sent"


@pytest.mark.parametrize(
    ("url", "options"),
    [
        (
            "redis://127.0.0.1:6390/0?socket_timeout=0.5&socket_connect_timeout=0.25"
            "&max_connections=7&pool_timeout=3",
            {},
        ),
        (
            "redis://127.0.0.1:6390/0",
            {
                "socket_timeout": 0.5,
                "socket_connect_timeout": 0.25,
                "max_connections": 7,
                "pool_timeout": 3,
            },
        ),
    ],
    ids=["query", "keywords"],
)
def test_standalone_bounds_from_url_or_keywords(url: str, options: dict[str, Any]) -> None:
    pool = _client(url, **options).connection_pool
    assert pool.connection_kwargs["socket_timeout"] == 0.5
    assert pool.connection_kwargs["socket_connect_timeout"] == 0.25
    assert pool.max_connections == 7
    assert pool.timeout == 3.0


def test_cluster_defaults_and_query() -> None:
    client = _client("redis+cluster://127.0.0.1:6390,127.0.0.1:6391")
    kwargs = client.nodes_manager.connection_kwargs
    assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (1.0, 5.0)
    assert kwargs["max_connections"] == 128
    assert client.reinitialize_steps == 0
    # A lost reply is never re-sent behind the caller's back.
    assert redis.exceptions.ConnectionError not in client.ERRORS_ALLOW_RETRY
    assert redis.exceptions.TimeoutError not in client.ERRORS_ALLOW_RETRY

    with pytest.raises(redis.exceptions.RedisClusterException, match="Lua script"):
        client.pipeline(transaction=True)

    tuned = _client(
        "redis+cluster://127.0.0.1:6390?socket_timeout=0.5&max_connections=7&pool_timeout=3"
    )
    assert tuned.nodes_manager.connection_kwargs["socket_timeout"] == 0.5
    assert tuned.nodes_manager.connection_kwargs["max_connections"] == 7
    assert (tuned._limit, tuned._pool_timeout) == (7, 3.0)


def test_sentinel_gets_the_bounds() -> None:
    client = _client("redis+sentinel://127.0.0.1:26390/mymaster?socket_timeout=0.5")
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (1.0, 0.5)
    assert isinstance(client.connection_pool, redis.asyncio.BlockingConnectionPool)
    assert (client.connection_pool.max_connections, client.connection_pool.timeout) == (128, 10.0)
    sentinel = client.connection_pool.sentinel_manager.sentinels[0]
    assert sentinel.connection_pool.connection_kwargs["socket_connect_timeout"] == 1.0


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6390/0?pool_timeout=soon", "redis+cluster://127.0.0.1:6390?pool_timeout=x"],
)
def test_bad_bound_is_refused(url: str) -> None:
    with pytest.raises(UnsupportedURLError):
        build_client(url)


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("redis://127.0.0.1:6390/abc", {}, "database number"),
        ("redis://127.0.0.1:6390/0/extra", {}, "database number"),
        ("redis://127.0.0.1:6390/-1", {}, "database number"),
        ("redis://127.0.0.1:6390/0?db=x", {}, "db must be"),
        ("redis+cluster://127.0.0.1:6390/2", {}, "database 0 only"),
        ("redis+sentinel://127.0.0.1:26390/mymaster/0/extra", {}, "/service/db"),
        ("redis+sentinel://127.0.0.1:26390/mymaster/abc", {}, "/service/db"),
        ("redis://127.0.0.1:6390/0?socket_timeout=0", {}, "socket_timeout"),
        ("redis://127.0.0.1:6390/0?socket_timeout=-1", {}, "socket_timeout"),
        ("redis://127.0.0.1:6390/0?socket_timeout=nan", {}, "socket_timeout"),
        ("redis://127.0.0.1:6390/0", {"socket_timeout": 0}, "socket_timeout"),
        ("redis://127.0.0.1:6390/0", {"socket_timeout": -1.0}, "socket_timeout"),
        ("redis://127.0.0.1:6390/0", {"socket_timeout": None}, "socket_timeout"),
        ("redis://127.0.0.1:6390/0", {"socket_connect_timeout": 0}, "socket_connect_timeout"),
        ("redis+cluster://127.0.0.1:6390", {"socket_timeout": 0}, "socket_timeout"),
        ("redis+sentinel://127.0.0.1:26390/m?socket_timeout=-2", {}, "socket_timeout"),
        ("redis://127.0.0.1:6390/0?pool_timeout=0", {}, "pool_timeout"),
        ("redis://127.0.0.1:6390/0", {"max_connections": 0}, "max_connections"),
        ("redis://127.0.0.1:6390/0", {"sockettimeout": 1}, "sockettimeout"),
        ("redis+unix:///tmp/none.sock", {"bogus": 1}, "bogus"),
        ("redis+cluster://127.0.0.1:6390", {"bogus": 1}, "bogus"),
        ("redis+sentinel://127.0.0.1:26390/m", {"bogus": 1}, "bogus"),
    ],
)
def test_what_redis_py_would_take_silently_or_fail_on_later_is_refused(
    url: str, options: dict[str, Any], message: str
) -> None:
    """A database path redis-py would read as 0, a bound that bounds nothing, a typo:
    each an ``UnsupportedURLError`` naming it, at ``from_url``, not at the first call."""
    with pytest.raises(UnsupportedURLError, match=message):
        build_client(url, **options)


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("redis://127.0.0.1:6390", {}),
        ("redis://127.0.0.1:6390/", {}),
        ("redis://127.0.0.1:6390/15", {}),
        ("redis://127.0.0.1:6390/0?db=3", {}),
        ("redis+cluster://127.0.0.1:6390/0", {}),
        ("redis+sentinel://127.0.0.1:26390/mymaster/2", {}),
        ("redis://127.0.0.1:6390/0", {"health_check_interval": 5, "client_name": "x"}),
        ("redis+cluster://127.0.0.1:6390", {"require_full_coverage": True}),
        ("redis+sentinel://127.0.0.1:26390/m", {"sentinel_kwargs": {"socket_timeout": 1}}),
    ],
)
def test_valid_paths_and_keywords_still_build(url: str, options: dict[str, Any]) -> None:
    _client(url, **options)

"""Redis clients from storage URLs: standalone, TLS, unix socket, cluster, sentinel.

Kept apart from the backend's data layout: how to reach Redis (pools, timeouts,
retries, credentials) changes for other reasons than what is stored there.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

from ..errors import UnsupportedURLError

__all__ = ["build_client"]


def build_client(url: str, *, client: Any = None, **options: Any) -> tuple[Any, str | None, bool]:
    """The client a URL names, the key prefix it asks for, and whether the caller owns the client.

    ``client`` short-circuits the construction (a ready ``redis.asyncio``
    client, fakeredis in tests); the URL then only supplies the prefix.
    """
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    # Pop the query's prefix even when the option wins: left in the query it
    # would reach redis-py as an unknown connection argument.
    query_prefix = query.pop("prefix", None)
    prefix = options.pop("prefix", None) or query_prefix
    if client is not None:
        return client, prefix, False
    options.setdefault("decode_responses", False)
    if options["decode_responses"]:
        raise UnsupportedURLError("replaystore needs decode_responses=False (payloads are bytes)")
    scheme = parts.scheme.lower()
    unknown = sorted(set(query) - _known_query_options())
    if unknown:
        raise UnsupportedURLError(f"unknown option(s) in redis URL: {', '.join(unknown)}")
    rest = urlunsplit(parts._replace(query=urlencode(query)))
    try:
        if scheme in ("redis+cluster", "rediss+cluster"):
            client = _cluster_client(parts, query, tls=scheme.startswith("rediss"), **options)
        elif scheme == "redis+sentinel":
            client = _sentinel_client(parts, query, **options)
        else:
            if scheme == "redis+unix":
                rest = "unix" + rest[len("redis+unix") :]
            # A blocking pool: past max_connections a call waits for a free
            # connection (up to pool_timeout) instead of failing, so a burst
            # of sessions slows down rather than turning into StorageErrors.
            options.setdefault("max_connections", 128)
            options["timeout"] = options.pop("pool_timeout", 10.0)
            pool = aioredis.BlockingConnectionPool.from_url(rest, **options)
            client = aioredis.Redis.from_pool(pool)  # closes the pool on aclose()
    except (ValueError, TypeError) as exc:
        raise UnsupportedURLError(f"bad redis URL {url!r}: {exc}") from exc
    return client, prefix, True


@functools.cache
def _known_query_options() -> frozenset[str]:
    """Query options redis-py accepts, so a typo fails here and not at the first call."""
    from redis.asyncio import connection

    names = set(connection.URL_QUERY_ARGUMENT_PARSERS)
    for cls in (
        connection.AbstractConnection,
        connection.Connection,
        connection.SSLConnection,
        connection.UnixDomainSocketConnection,
    ):
        names |= set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs"}
    return frozenset(names)


def _hosts(parts: Any) -> list[tuple[str, int]]:
    netloc = parts.netloc.rsplit("@", 1)[-1]
    hosts = []
    for item in netloc.split(","):
        host, _, port = item.rpartition(":")
        if not host:
            host, port = port, "6379"
        hosts.append((host.strip("[]"), int(port)))
    if not hosts or not all(h for h, _ in hosts):
        raise ValueError("no host given")
    return hosts


def _credentials(parts: Any) -> dict[str, Any]:
    netloc = parts.netloc
    if "@" not in netloc:
        return {}
    userinfo = netloc.rsplit("@", 1)[0]
    user, _, password = userinfo.partition(":")
    out: dict[str, Any] = {}
    if user:
        out["username"] = unquote(user)
    if password:
        out["password"] = unquote(password)
    return out


def _query_options(query: dict[str, str]) -> dict[str, Any]:
    """Query options typed the way redis-py types them for ``redis://`` URLs."""
    from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS

    out: dict[str, Any] = {}
    for name, value in query.items():
        parser = URL_QUERY_ARGUMENT_PARSERS.get(name)
        out[name] = parser(value) if parser else value
    return out


def _cluster_client(parts: Any, query: dict[str, str], *, tls: bool, **options: Any) -> Any:
    nodes = [ClusterNode(host, port) for host, port in _hosts(parts)]
    options = {**_query_options(query), **_credentials(parts), **options}
    if tls:
        options.setdefault("ssl", True)
    return RedisCluster(startup_nodes=nodes, **options)


def _sentinel_client(parts: Any, query: dict[str, str], **options: Any) -> Any:
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError("redis+sentinel:// needs the service name as the path")
    service = path[0]
    db = int(path[1]) if len(path) > 1 else 0
    # socket_* options reach the sentinels too (redis-py copies them).
    options = {**_query_options(query), **_credentials(parts), **options}
    sentinel = Sentinel(_hosts(parts), **options)  # type: ignore[no-untyped-call]
    return sentinel.master_for(service, db=db, redis_class=aioredis.Redis)

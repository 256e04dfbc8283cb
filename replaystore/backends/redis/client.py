"""Redis clients from storage URLs: standalone, TLS, unix socket, cluster, sentinel.

Kept apart from the backend's data layout: how to reach Redis (pools, timeouts,
retries, credentials) changes for other reasons than what is stored there.

Every client gets the same bounded behaviour, each bound a URL query option or
a ``from_url`` keyword of the same name:

``socket_connect_timeout`` (default 1 s)
    How long to wait for a TCP connection. Redis on the same network accepts
    in well under a millisecond; past this, the store counts as unreachable.
``socket_timeout`` (default 5 s)
    How long to wait for one reply. One operation is one short Lua script,
    so this only expires when Redis is stuck or the network is partitioned.
``max_connections`` (default 128) and ``pool_timeout`` (default 10 s)
    Past ``max_connections`` operations in flight, a call waits up to
    ``pool_timeout`` for a free connection, so a burst slows down instead of
    failing, with a standalone server, a Sentinel-managed master or a cluster.
    On a cluster the bound covers the whole client (so no node ever sees
    more), where redis-py alone would raise at once past 100 connections per
    node; through Sentinel redis-py alone would open ever more connections.

With Redis down, every operation therefore fails with ``StorageError`` in a
time these settings bound: at once for a refused connection, and within
about ``socket_connect_timeout + socket_timeout`` per attempt when Redis
hangs or the network is partitioned (the backend tries an idempotent
operation twice; a cluster client first looks for its nodes again). No
client re-sends a command on its own after a connection error: the reply of
a lost append may have been executed, so whether to retry is the backend's
decision, per operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import math
import re
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    MaxConnectionsError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.maint_notifications import MaintNotificationsConfig

from ...errors import UnsupportedURLError

__all__ = ["build_client"]

DEFAULT_SOCKET_CONNECT_TIMEOUT = 1.0
DEFAULT_SOCKET_TIMEOUT = 5.0
DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_POOL_TIMEOUT = 10.0
_SETTLE_TIME = 2.0
_SETTLE_PAUSE = 0.05
_DEFAULT_TIMEOUTS = {
    "socket_connect_timeout": DEFAULT_SOCKET_CONNECT_TIMEOUT,
    "socket_timeout": DEFAULT_SOCKET_TIMEOUT,
}


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
    family = _family(scheme)
    unknown = sorted(set(options) - _known_keywords(family))
    if unknown:
        raise UnsupportedURLError(
            f"unknown option(s) for a {scheme}:// store: {', '.join(unknown)}"
        )
    _check_bounds(query, options)
    _check_path(family, parts.path, query)
    try:
        pool_timeout = float(
            options.pop("pool_timeout", query.pop("pool_timeout", DEFAULT_POOL_TIMEOUT))
        )
        rest = urlunsplit(parts._replace(query=urlencode(query)))
        if scheme in ("redis+cluster", "rediss+cluster"):
            client = _cluster_client(
                parts, query, tls=scheme.startswith("rediss"), pool_timeout=pool_timeout, **options
            )
        elif scheme == "redis+sentinel":
            client = _sentinel_client(parts, query, pool_timeout=pool_timeout, **options)
        else:
            # redis-py lets the URL's query win over these keywords.
            options = {**_DEFAULT_TIMEOUTS, **options}
            if scheme in ("unix", "redis+unix"):
                # Spelled out: urlunsplit drops the empty authority ("unix:/path"),
                # which redis-py 8.2 and newer refuse.
                rest = f"unix://{parts.netloc}{parts.path}"
                if query:
                    rest += f"?{urlencode(query)}"
            # A blocking pool: past max_connections a call waits for a free
            # connection (up to pool_timeout) instead of failing, so a burst
            # of sessions slows down rather than turning into StorageErrors.
            options.setdefault("max_connections", DEFAULT_MAX_CONNECTIONS)
            options["timeout"] = pool_timeout
            # With maintenance notifications on ("auto", redis-py 8's default)
            # the pool skips its check-out test for connections the
            # server closed, so the first call after a Redis restart fails
            # on a dead pooled connection. Off, a closed connection is
            # replaced before anything is sent on it.
            options.setdefault(
                "maint_notifications_config", MaintNotificationsConfig(enabled=False)
            )
            pool = aioredis.BlockingConnectionPool.from_url(rest, **options)
            client = aioredis.Redis.from_pool(pool)  # closes the pool on aclose()
    except (ValueError, TypeError) as exc:
        raise UnsupportedURLError(f"bad redis URL {url!r}: {exc}") from exc
    return client, prefix, True


def _family(scheme: str) -> str:
    if scheme in ("redis+cluster", "rediss+cluster"):
        return "cluster"
    if scheme == "redis+sentinel":
        return "sentinel"
    if scheme in ("redis+unix", "unix"):
        return "unix"
    return "standalone"


@functools.cache
def _known_keywords(family: str) -> frozenset[str]:
    """Keywords the client of ``family`` takes, so a typo fails in ``from_url``.

    Unchecked, a wrong keyword would reach redis-py as a ``TypeError`` at the
    first call, far from the line that caused it.
    """
    from redis.asyncio import connection

    names = set(_known_query_options()) | {"max_connections"}
    if family == "cluster":
        names |= _parameters(RedisCluster.__init__)
    else:
        # A Sentinel passes what it does not take itself to the master's pool.
        if family == "sentinel":
            names |= _parameters(Sentinel.__init__) - {"sentinels"}
        names |= _parameters(connection.BlockingConnectionPool.__init__)
        names |= _parameters(connection.ConnectionPool.__init__)
    return frozenset(names)


def _parameters(function: Any) -> set[str]:
    return {
        name
        for name, p in inspect.signature(function).parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


_ABSENT = object()


def _check_bounds(query: dict[str, str], options: dict[str, Any]) -> None:
    """Refuse bounds that cannot bound anything, wherever they come from.

    A timeout of zero or less makes every call fail with a timeout that looks
    like an unreachable server, and ``None`` would wait for ever; past this
    check, each call of the backend is bounded as the module says.
    """
    for name in ("socket_timeout", "socket_connect_timeout", "pool_timeout"):
        for where, value in (
            ("URL", query.get(name, _ABSENT)),
            ("keyword", options.get(name, _ABSENT)),
        ):
            if value is _ABSENT:
                continue
            seconds = _number(value, float)
            if seconds is None or not math.isfinite(seconds) or seconds <= 0:
                raise UnsupportedURLError(
                    f"{name} ({where}) must be a positive number of seconds, not {value!r}"
                )
    for where, value in (
        ("URL", query.get("max_connections", _ABSENT)),
        ("keyword", options.get("max_connections", _ABSENT)),
    ):
        if value is _ABSENT:
            continue
        count = _number(value, int)
        if count is None or count < 1:
            raise UnsupportedURLError(
                f"max_connections ({where}) must be at least 1, not {value!r}"
            )


def _number(value: Any, kind: type[float] | type[int]) -> float | int | None:
    """``value`` (a query string or a keyword) as a ``kind``, or ``None`` if it is not one."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _check_path(family: str, path: str, query: dict[str, str]) -> None:
    """The database a URL names: a number where redis-py would silently fall back to 0.

    ``redis://host/abc`` or ``redis://host/0/extra`` would otherwise use
    database 0, the data of another application perhaps.
    """
    if "db" in query and (_number(query["db"], int) is None or int(query["db"]) < 0):
        raise UnsupportedURLError(f"db must be a database number, not {query['db']!r}")
    if family == "standalone" and not re.fullmatch(r"/?|/(0|[1-9][0-9]*)/?", path):
        raise UnsupportedURLError(
            f"the path of a redis URL is the database number (/0, /1 ...), not {path!r}"
        )
    if family == "cluster" and not re.fullmatch(r"/?(0/?)?", path):
        raise UnsupportedURLError(f"a Redis Cluster has database 0 only, not {path!r}")
    if family == "sentinel":
        names = [p for p in path.split("/") if p]
        if len(names) > 2 or (len(names) == 2 and not re.fullmatch(r"0|[1-9][0-9]*", names[1])):
            raise UnsupportedURLError(
                f"a redis+sentinel:// path is /service or /service/db, not {path!r}"
            )


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
    return frozenset(names | {"pool_timeout"})


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


def _cluster_client(
    parts: Any, query: dict[str, str], *, tls: bool, pool_timeout: float, **options: Any
) -> Any:
    nodes = [ClusterNode(host, port) for host, port in _hosts(parts)]
    options = {**_DEFAULT_TIMEOUTS, **_query_options(query), **_credentials(parts), **options}
    if tls:
        options.setdefault("ssl", True)
    options.setdefault("max_connections", DEFAULT_MAX_CONNECTIONS)
    # Every few MOVED replies redis-py would rebuild its slot map by closing
    # the whole client, cutting the connections of every call in flight. A
    # MOVED reply carries the slot's new owner: following it is enough.
    options.setdefault("reinitialize_steps", 0)
    return _WaitingCluster(startup_nodes=nodes, pool_timeout=pool_timeout, **options)


class _WaitingCluster(RedisCluster):
    """A cluster client that waits instead of failing, and never re-sends after a lost reply.

    redis-py's async cluster client raises ``MaxConnectionsError`` at once
    when a node has ``max_connections`` connections in use, so a burst of
    callers in one process fails where the standalone client's blocking pool
    would have waited. Here at most ``max_connections`` commands and
    pipelines are in flight for the whole client (each holds at most one
    connection per node), and the others wait, up to ``pool_timeout``.

    redis-py also re-sends a command after a connection error or a timeout,
    which duplicates an append whose reply was lost after Redis executed it.
    Only errors that prove the command did not run are retried here: cluster
    down, slot not covered, and, for up to ``_SETTLE_TIME`` with a short
    pause between rounds, a slot still being moved (TRYAGAIN, or redis-py
    giving up on the redirections: it sends ASKING and the redirected command
    on different pooled connections, so an ASK can bounce between two nodes).
    """

    # redis-py types the tuple by its own default; a shorter one is what we mean.
    ERRORS_ALLOW_RETRY = (ClusterDownError, SlotNotCoveredError)  # type: ignore[assignment]

    def __init__(self, *args: Any, pool_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limit = int(kwargs["max_connections"])
        self._in_flight = asyncio.Semaphore(self._limit)
        self._pool_timeout = pool_timeout

    @contextlib.asynccontextmanager
    async def in_flight(self) -> AsyncIterator[None]:
        """Hold one of the ``max_connections`` places (once per task, however nested)."""
        if _HOLDING.get():
            yield
            return
        try:
            async with asyncio.timeout(self._pool_timeout):
                await self._in_flight.acquire()
        except TimeoutError:
            raise MaxConnectionsError(
                f"no free Redis Cluster connection within {self._pool_timeout:g}s "
                f"({self._limit} commands in flight)"
            ) from None
        token = _HOLDING.set(True)
        try:
            yield
        finally:
            _HOLDING.reset(token)
            self._in_flight.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.in_flight():
            loop = asyncio.get_running_loop()
            settled_by = loop.time() + _SETTLE_TIME
            while True:
                try:
                    return await super().execute_command(*args, **kwargs)
                except (TryAgainError, ClusterError) as exc:
                    # Exactly these types: every attempt was refused, none ran.
                    if type(exc) not in (TryAgainError, ClusterError) or loop.time() > settled_by:
                        raise
                await asyncio.sleep(_SETTLE_PAUSE)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        if shard_hint:
            raise RedisClusterException("shard_hint is deprecated in cluster mode")
        if transaction:
            # redis-py runs each command queued in a cluster transaction in a
            # new thread and event loop, blocking the caller's loop, and after
            # a connection error leaves connections bound to that dead loop.
            raise RedisClusterException("use a Lua script, not a transaction, on a cluster")
        return _WaitingPipeline(self, transaction)  # type: ignore[abstract]


class _WaitingPipeline(ClusterPipeline):
    """A cluster pipeline that takes its place among the client's ``max_connections``."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        client = cast(_WaitingCluster, self.cluster_client)
        async with client.in_flight():
            return await super().execute(raise_on_error, allow_redirections)


_HOLDING: ContextVar[bool] = ContextVar("replaystore_cluster_in_flight", default=False)


def _sentinel_client(
    parts: Any, query: dict[str, str], *, pool_timeout: float, **options: Any
) -> Any:
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError("redis+sentinel:// needs the service name as the path")
    service = path[0]
    db = int(path[1]) if len(path) > 1 else 0
    # socket_* options reach the sentinels too (redis-py copies them).
    options = {**_DEFAULT_TIMEOUTS, **_query_options(query), **_credentials(parts), **options}
    # Through Any: older redis-py releases leave Sentinel() untyped, newer ones type it.
    make_sentinel: Any = Sentinel
    sentinel = make_sentinel(_hosts(parts), **options)
    return sentinel.master_for(
        service,
        db=db,
        redis_class=aioredis.Redis,
        connection_pool_class=_BlockingSentinelPool,
        max_connections=options.get("max_connections", DEFAULT_MAX_CONNECTIONS),
        timeout=pool_timeout,
    )


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The master's pool, blocking like the standalone one: past ``max_connections`` a call
    waits for a free connection (``pool_timeout``) instead of opening ever more of them."""

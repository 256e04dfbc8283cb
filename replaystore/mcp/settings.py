"""The timings of a replica set, in one value.

Every part of :mod:`replaystore.mcp` that waits on the store or on another
replica reads its timing from one frozen :class:`Settings`, built once where
the app is wired (``streamable_http_app``, ``fastmcp_http_app``,
``ReplaySessionManager``) and handed down, so no two parts can disagree on a
lease length or a check interval. This module imports nothing else of the
package, so any module can depend on it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_CHECK_INTERVAL",
    "DEFAULT_DRAIN_SECONDS",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_STORE_TIMEOUT",
    "Settings",
]

#: Seconds a request's lease lasts without renewal: how long a client waits,
#: at most, for the answer to a request whose replica stopped.
DEFAULT_LEASE_TTL = 5.0

#: Seconds between two store checks of a live connection (lost wake-ups, lapsed leases).
DEFAULT_CHECK_INTERVAL = 1.0

#: Seconds a replica told to stop lets running requests and tasks finish,
#: taking no new work meanwhile, before it hands over what still runs.
DEFAULT_DRAIN_SECONDS = 10.0

#: Seconds a request waits for the store before it is answered 503 (with
#: ``Retry-After``): a store outage must not hold requests for long.
DEFAULT_STORE_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class Settings:
    """How a replica times its leases, store checks and store calls.

    ``lease_ttl`` bounds how long a client waits for the answer to a request
    whose replica stopped (renewed every third of it while the request runs);
    ``check_interval`` is how often a live connection of a request stream
    re-reads the store (a lost notification, a lapsed lease); connections of
    the standalone GET stream re-read ``get_check_factor`` times less often:
    they have no lease to watch, and a lost notification (rare: the bus also
    wakes every connection after it reconnects) costs them latency only.
    ``store_timeout`` is how long a request waits for an unresponsive store
    before it is answered 503. ``live_reads`` bounds the store reads of live
    connections in flight at once per replica, so the connection pool does
    not grow with the number of attached clients.
    """

    lease_ttl: float = DEFAULT_LEASE_TTL
    check_interval: float = DEFAULT_CHECK_INTERVAL
    store_timeout: float = DEFAULT_STORE_TIMEOUT
    get_check_factor: int = 10
    live_reads: int = 8

    def __post_init__(self) -> None:
        if self.lease_ttl <= 0 or self.check_interval <= 0 or self.store_timeout <= 0:
            raise ValueError("lease_ttl, check_interval and store_timeout must be positive")
        if self.get_check_factor < 1 or self.live_reads < 1:
            raise ValueError("get_check_factor and live_reads must be at least 1")

"""What a replica needs from its store, checked: once at start-up, and by every health check.

A replica serves nothing when its store refuses writes (out of memory with
``noeviction``, a read-only replica, a disk that cannot persist) or forbids
a command, key or channel it needs (its ACL). The store is asked, with
calls of the kinds requests make, under the replica's own key prefix:

- :func:`probe` (each health check): a lease taken and dropped (a write
  with an expiry, a script), a session looked up (a script), a publish on
  the replica channels' prefix;
- :func:`probe` with ``deep`` (start-up, and health checks while a refusal
  that waiting cannot cure was seen): a throwaway session opened, appended
  to (the commands of every append, ``TIME`` included), resumed and closed,
  and a subscription on the notification channels' prefix;
- at start-up, whether the store may evict keys (Redis'
  ``maxmemory-policy``), since an evicted key ends its session.

What each store is asked beyond the sessions' operations and the registry
(the notification channels, the eviction policy) its backend's coordination
says (:meth:`~replaystore.backends.coordination.Coordination.probe`).

Each failure is the :class:`~replaystore.errors.StorageError` of the call
that failed, which says what the store said (the ACL's words name the
command, key or channel).
"""

from __future__ import annotations

import secrets
from contextlib import suppress
from dataclasses import dataclass

from ..backends.coordination import Coordination
from ..backends.session_registry import Registry
from ..buffer import ReplayBuffer
from ..errors import StorageError
from .refusals import bounded, store_trouble

__all__ = ["Problem", "check_store", "probe"]

#: The stream of the lease the health check takes and drops at once.
_PROBE_STREAM = "probe"
#: Seconds the probe's lease, and its throwaway session's tombstone, live.
_PROBE_TTL = 5.0


@dataclass(frozen=True)
class Problem:
    """One thing the store does not give a replica; ``fatal``: it cannot serve until fixed."""

    text: str
    fatal: bool


async def probe(
    buffer: ReplayBuffer,
    coordination: Coordination,
    registry: Registry,
    replica: str,
    *,
    deep: bool,
) -> None:
    """Ask the store for what requests need; raise :class:`StorageError` on the first refusal.

    ``coordination``: the store's, and ``registry`` the session registry it built.
    """
    session = f"probe.{replica}"
    await registry.acquire(session, _PROBE_STREAM, replica, _PROBE_TTL)
    await registry.abandon(session, _PROBE_STREAM, replica)
    await buffer.session_info(session)
    await coordination.probe(replica)
    if not deep:
        return
    throwaway = f"probe.{replica}.{secrets.token_hex(4)}"
    await buffer.open_session(throwaway)
    try:
        first = await buffer.append(throwaway, _PROBE_STREAM, None)
        await buffer.append(throwaway, _PROBE_STREAM, b"{}")
        await buffer.resolve_and_replay(throwaway, first)
    except StorageError:
        with suppress(StorageError):  # the first refusal is the one to tell
            await buffer.close_session(throwaway, tombstone_ttl=_PROBE_TTL)
        raise
    await buffer.close_session(throwaway, tombstone_ttl=_PROBE_TTL)
    await coordination.probe(replica, subscribe=True)


async def check_store(
    buffer: ReplayBuffer, coordination: Coordination, *, seconds: float = 5.0
) -> list[Problem]:
    """What the store does not give a replica, each in one line (empty: all is well).

    Fatal: a refusal that waiting cannot cure (the ACL forbids a command, a
    key or a channel). Not fatal: a store out of reach, out of memory or
    read-only now (requests get 503 until it serves again), and an eviction
    policy that may end sessions. ``coordination``: the store's.
    """
    problems: list[Problem] = []
    registry = coordination.registry()
    try:
        with bounded(seconds):
            replica = f"start.{secrets.token_hex(4)}"
            await probe(buffer, coordination, registry, replica, deep=True)
    except StorageError as exc:
        if exc.permanent:
            problems.append(Problem(f"{store_trouble(exc)}; this replica cannot serve", True))
        else:
            text = f"{store_trouble(exc)}; requests get 503 until it serves again"
            problems.append(Problem(text, False))
        if exc.kind == "unreachable":
            return problems
    try:
        with bounded(seconds):
            warning = await coordination.eviction_warning()
    except StorageError:
        warning = None
    if warning is not None:
        problems.append(Problem(warning, False))
    return problems

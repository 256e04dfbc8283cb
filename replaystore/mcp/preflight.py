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
- :func:`eviction_warning` (start-up): Redis' ``maxmemory-policy``, since
  an evicted key ends its session.

Each failure is the :class:`~replaystore.errors.StorageError` of the call
that failed, which says what the store said (the ACL's words name the
command, key or channel).
"""

from __future__ import annotations

import logging
import secrets
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ..backends.coordination import OnRedis, coordination_of
from ..buffer import ReplayBuffer
from ..errors import StorageError
from .refusals import store_trouble
from .replicas.registry import Registry, registry_for
from .sessions.again import bounded

__all__ = ["Problem", "check_store", "eviction_warning", "probe"]

logger = logging.getLogger("replaystore.mcp")

#: The stream of the lease the health check takes and drops at once.
_PROBE_STREAM = "probe"
#: Milliseconds the probe's lease lives, should dropping it fail.
_PROBE_TTL = 5.0


@dataclass(frozen=True)
class Problem:
    """One thing the store does not give a replica; ``fatal``: it cannot serve until fixed."""

    text: str
    fatal: bool


async def probe(buffer: ReplayBuffer, registry: Registry, replica: str, *, deep: bool) -> None:
    """Ask the store for what requests need; raise :class:`StorageError` on the first refusal."""
    session = f"probe.{replica}"
    await registry.acquire(session, _PROBE_STREAM, replica, _PROBE_TTL)
    await registry.abandon(session, _PROBE_STREAM, replica)
    await buffer.session_info(session)
    coordination = coordination_of(buffer.backend)
    if isinstance(coordination, OnRedis):
        await _publish(coordination, replica)
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
            await buffer.close_session(throwaway)
        raise
    await buffer.close_session(throwaway)
    if isinstance(coordination, OnRedis):
        await _subscribe(coordination, replica)


async def _publish(redis: OnRedis, replica: str) -> None:
    from ..backends.redis.keys import probe_channel  # only on Redis: imports redis-py

    try:
        await redis.client.publish(probe_channel(redis.prefix, replica), "")
    except Exception as exc:  # redis.RedisError and cluster errors alike
        raise _storage_error("publishing a notification", exc) from exc


async def _subscribe(redis: OnRedis, replica: str) -> None:
    from ..backends.redis.keys import probe_channel  # only on Redis: imports redis-py

    pubsub = redis.client.pubsub()
    try:
        await pubsub.subscribe(probe_channel(redis.prefix, replica))
        await pubsub.get_message(timeout=0.1)  # the subscription's confirmation or refusal
    except Exception as exc:
        raise _storage_error("subscribing to notifications", exc) from exc
    finally:
        try:
            await pubsub.aclose()
        except Exception:
            logger.debug("closing the probe's subscription failed", exc_info=True)


def _storage_error(what: str, exc: BaseException) -> StorageError:
    from ..backends.redis.client import storage_error

    return storage_error(what, exc)


async def eviction_warning(buffer: ReplayBuffer) -> str | None:
    """One line when Redis may evict replaystore's keys (or its policy is unknown), else None."""
    coordination = coordination_of(buffer.backend)
    if not isinstance(coordination, OnRedis):
        return None
    settings = await _memory_settings(coordination.client)
    if settings is None:
        return (
            "the store's maxmemory-policy cannot be read (CONFIG GET and INFO are not "
            "permitted): make sure it is noeviction, or that maxmemory is 0; an evicted key "
            "ends its session (its clients get 404 and initialize again)"
        )
    policy, maxmemory = settings
    if policy == "noeviction" or maxmemory == 0:
        return None
    also = " (every replaystore key has a TTL)" if policy.startswith("volatile-") else ""
    return (
        f"the store's maxmemory-policy is {policy}{also}: once maxmemory is reached Redis "
        "evicts replaystore's keys, which ends their sessions (clients get 404 and "
        "initialize again); use noeviction"
    )


async def _memory_settings(client: Any) -> tuple[str, int] | None:
    """``(maxmemory-policy, maxmemory)`` by CONFIG GET or else INFO; None if neither is allowed."""
    try:
        found = await client.config_get("maxmemory*")
        if found and all(isinstance(v, dict) for v in found.values()):
            found = next(iter(found.values()))  # a cluster: per node; one node says it
        return str(found["maxmemory-policy"]), int(found["maxmemory"])
    except Exception:
        logger.debug("CONFIG GET maxmemory* failed", exc_info=True)
    try:
        info = await client.info("memory")
        if info and all(isinstance(v, dict) for v in info.values()):
            info = next(iter(info.values()))
        return str(info["maxmemory_policy"]), int(info["maxmemory"])
    except Exception:
        logger.debug("INFO memory failed", exc_info=True)
    return None


async def check_store(buffer: ReplayBuffer, *, seconds: float = 5.0) -> list[Problem]:
    """What the store does not give a replica, each in one line (empty: all is well).

    Fatal: a refusal that waiting cannot cure (the ACL forbids a command, a
    key or a channel). Not fatal: a store out of reach, out of memory or
    read-only now (requests get 503 until it serves again), and an eviction
    policy that may end sessions.
    """
    problems: list[Problem] = []
    registry = registry_for(coordination_of(buffer.backend))
    try:
        with bounded(seconds):
            await probe(buffer, registry, f"start.{secrets.token_hex(4)}", deep=True)
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
            warning = await eviction_warning(buffer)
    except StorageError:
        warning = None
    if warning is not None:
        problems.append(Problem(warning, False))
    return problems

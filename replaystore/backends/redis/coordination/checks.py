"""What a replica asks Redis at start-up and in health checks, beyond the sessions' commands.

The notifications need ``PUBLISH`` and ``SUBSCRIBE`` on the replica channels'
prefix (an ACL may forbid either), and Redis' ``maxmemory-policy`` says
whether it may evict replaystore's keys, which ends their sessions.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import STORE_ERRORS, mapped, note_policy
from ..keys import probe_channel

__all__ = ["eviction_warning", "publish", "subscribe"]

logger = logging.getLogger("replaystore.mcp")

#: Why a setting may not be read: the store refused (an ACL forbids CONFIG
#: or INFO) or failed, or its reply lacks the field (a server that hides it).
_UNREADABLE: tuple[type[BaseException], ...] = (*STORE_ERRORS, KeyError, ValueError)


async def publish(client: Any, prefix: str, replica: str) -> None:
    """One ``PUBLISH`` on the replica's probe channel; the refusal as a ``StorageError``."""
    with mapped("publishing a notification"):
        await client.publish(probe_channel(prefix, replica), "")


async def subscribe(client: Any, prefix: str, replica: str) -> None:
    """A subscription to the replica's probe channel, confirmed or refused, then dropped."""
    pubsub = client.pubsub()
    try:
        with mapped("subscribing to notifications"):
            await pubsub.subscribe(probe_channel(prefix, replica))
            await pubsub.get_message(timeout=0.1)  # the subscription's confirmation or refusal
    finally:
        try:
            await pubsub.aclose()
        except STORE_ERRORS:
            logger.debug("closing the probe's subscription failed", exc_info=True)


async def eviction_warning(client: Any) -> str | None:
    """One line when Redis may evict replaystore's keys (or its policy is unknown), else None."""
    settings = await _memory_settings(client)
    if settings is None:
        return (
            "the store's maxmemory-policy cannot be read (CONFIG GET and INFO are not "
            "permitted): make sure it is noeviction, or that maxmemory is 0; an evicted key "
            "ends its session (its clients get 404 and initialize again)"
        )
    policy, maxmemory = settings
    if policy == "noeviction" or maxmemory == 0:
        return None
    also = (
        " (every replaystore key but the requestState key has a TTL)"
        if policy.startswith("volatile-")
        else ""
    )
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
        policy, maxmemory = str(found["maxmemory-policy"]), int(found["maxmemory"])
        note_policy(client, policy)
        return policy, maxmemory
    except _UNREADABLE:
        logger.debug("CONFIG GET maxmemory* failed", exc_info=True)
    try:
        info = await client.info("memory")
        if info and all(isinstance(v, dict) for v in info.values()):
            info = next(iter(info.values()))
        policy, maxmemory = str(info["maxmemory_policy"]), int(info["maxmemory"])
        note_policy(client, policy)
        return policy, maxmemory
    except _UNREADABLE:
        logger.debug("INFO memory failed", exc_info=True)
    return None

"""How replicas sharing a Redis coordinate: :class:`OnRedis`, and the parts it builds.

Every part keeps its keys behind the backend's key base (the session's hash
tag, so on a cluster they land in the slot of the session's events) and
builds every key and channel name in :mod:`replaystore.backends.redis.keys`:

| module | part |
|---|---|
| ``registry.py`` | session records, request leases, end claims |
| ``bus.py`` | notifications between replicas (pub/sub) |
| ``tasks.py`` | durable task records (Lua in ``lua/``) |
| ``listen.py`` | ``subscriptions/listen`` events (a stream read by position) |
| ``checks.py`` | what a replica asks at start-up and in health checks |
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..errors import mapped
from ..keys import matching, request_state, request_state_used
from ..marker import StoreMarker
from ..wire import Wire, wire_for

if TYPE_CHECKING:
    from ....taskstore.store import TaskStore
    from ...notifications import Bus, Handler
    from ...session_registry import Registry
    from .listen import RedisEventLog

__all__ = ["OnRedis"]


class OnRedis:
    """Replicas share a Redis: ``client`` (redis-py asyncio), the key ``prefix``, and
    ``key_base(session)``, the hash-tagged base of a session's keys (coordination
    keys go behind it, so on a cluster they land in the slot of the session's events).

    What :class:`~replaystore.backends.redis.RedisBackend` declares; a
    third-party backend storing its events in Redis can declare it too. Each
    part is imported when first built, so an app without tasks never loads
    the task store.
    """

    #: Replicas in other processes share the Redis.
    spans_processes = True

    __slots__ = ("client", "end_restored", "key_base", "marker", "prefix", "wire")

    def __init__(
        self,
        client: Any,
        prefix: str,
        key_base: Callable[[str], str],
        wire: Wire | None = None,
        marker: StoreMarker | None = None,
        end_restored: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.client = client
        #: How the registry's and the bus's commands reach Redis (the backend's own, shared).
        self.wire = wire if wire is not None else wire_for(client)
        self.prefix = prefix
        self.key_base = key_base
        #: The store's run marker, shared by every part (:mod:`..marker`); None: not watched.
        self.marker = marker
        #: Ends a session's events for every replica when the store went back since it began.
        self.end_restored = end_restored

    def registry(self) -> Registry:
        from .registry import RedisRegistry

        return RedisRegistry(self.wire, self.key_base, self.marker, self.end_restored)

    def bus(self, replica: str, handler: Handler) -> Bus:
        from .bus import RedisBus
        from .outage import watch_of

        return RedisBus(
            replica, handler, self.wire, self.prefix, watch_of(self.client, self.prefix)
        )

    def task_store(
        self, *, namespace: str = "", wait_replicas: int = 0, wait_timeout: float = 1.0
    ) -> TaskStore:
        from .tasks import RedisTaskStore

        return RedisTaskStore(
            self.client,
            self.key_base,
            namespace=namespace,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
            marker=self.marker,
        )

    def listen_events(self, *, keep: int, block: float | None) -> RedisEventLog:
        from .listen import RedisEventLog
        from .outage import watch_of

        watch = watch_of(self.client, self.prefix)
        return RedisEventLog(self.client, self.key_base, keep=keep, block=block, watch=watch)

    async def request_state_key(self, candidate: str) -> tuple[str, bool]:
        """No TTL: a ``volatile-*`` eviction policy never takes it (``allkeys-*`` may)."""
        key = request_state(self.prefix)
        with mapped("reading the shared requestState key", self.client):
            if await self.client.set(key, candidate, nx=True):
                return candidate, True
            stored = await self.client.get(key)
        if stored is None:  # lost between the two commands: take it as lost now
            return await self.request_state_key(candidate)
        return (stored.decode() if isinstance(stored, bytes) else str(stored)), False

    async def first_use(self, digest: str, ttl: float) -> str | None:
        key = request_state_used(self.prefix, digest)
        with mapped("recording a used requestState", self.client):
            if await self.client.set(key, "", nx=True, px=_ms(ttl)):
                return None
            kept = await self.client.get(key)
        if kept is None:  # expired between the two commands: it was recorded all the same
            return ""
        return kept.decode() if isinstance(kept, bytes) else str(kept)

    async def keep_answer(self, digest: str, answer: str, ttl: float) -> None:
        key = request_state_used(self.prefix, digest)
        with mapped("keeping a round's answer", self.client):
            await self.client.set(key, answer, xx=True, px=_ms(ttl))

    async def probe(self, replica: str, *, subscribe: bool = False) -> None:
        from . import checks

        if subscribe:
            await checks.subscribe(self.client, self.prefix, replica)
        else:
            await checks.publish(self.client, self.prefix, replica)

    async def eviction_warning(self) -> str | None:
        from .checks import eviction_warning

        return await eviction_warning(self.client)

    async def expiries(self, session: str) -> dict[str, float | None]:
        """Every key of the session (its events, record, leases, end claims, tombstone), and
        the seconds it has left (None: no expiry), for an operator's eyes."""
        pattern = matching(self.key_base(session))
        with mapped("reading the session's expiries"):
            found = sorted([key async for key in self.client.scan_iter(match=pattern, count=1000)])
            left = {}
            for key in found:  # one by one: a cluster refuses multi-key commands across slots
                ms = await self.client.pttl(key)
                name = key.decode() if isinstance(key, bytes) else str(key)
                left[name] = None if ms == -1 else (ms / 1000 if ms >= 0 else 0.0)
        return left

    async def purge(self, session: str) -> None:
        """Every key of the session carries it in its cluster hash tag, so one ``SCAN``
        pattern finds them on a standalone server and on every cluster node."""
        pattern = matching(self.key_base(session))
        keys = [key async for key in self.client.scan_iter(match=pattern, count=1000)]
        for key in keys:  # one by one: a cluster refuses multi-key commands across slots
            await self.client.delete(key)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))

"""One server process's membership in a set of replicas sharing a store.

A :class:`Replica` has an id, the session registry and the notification bus
of its store, the leases of the requests it runs (renewed by one background
task), and the store views of the sessions it currently serves, to which it
hands wake-ups, takeovers and session ends coming from the other replicas.
Nothing here needs configuration: processes (or apps) on one buffer URL are
replicas of each other.

**Leases.** A POST's request takes a lease on its stream before it is
dispatched, renewed every ``lease_ttl / 3`` seconds while it runs and
released when its response is stored. A connection following that stream on
any replica checks, every ``check_interval`` seconds, whether the lease is
still held; if it lapsed (replica killed, network partition) and the stream
has no response, one replica wins the end claim and stores a JSON-RPC error
response for the request, which every connection on the stream then
delivers: the client gets an answer within about ``lease_ttl +
check_interval`` seconds, never a hang.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ..buffer import ReplayBuffer
from ..errors import StorageError
from .bus import Bus, bus_for
from .registry import FINISHED, Registry, registry_for

if TYPE_CHECKING:
    from .store import SessionEventStore

__all__ = ["DEFAULT_CHECK_INTERVAL", "DEFAULT_LEASE_TTL", "DEFAULT_STORE_TIMEOUT", "Replica"]

logger = logging.getLogger("replaystore.mcp")

#: Seconds a request's lease lasts without renewal: how long a client waits,
#: at most, for the answer to a request whose replica stopped.
DEFAULT_LEASE_TTL = 5.0

#: Seconds between two store checks of a live connection (lost wake-ups, lapsed leases).
DEFAULT_CHECK_INTERVAL = 1.0

#: Seconds a request waits for the store before it is answered 503 (with
#: ``Retry-After``): a store outage must not hold requests for long.
DEFAULT_STORE_TIMEOUT = 1.0

#: Live connections of the standalone GET stream re-check the store this many
#: times less often than request streams: they have no lease to watch, and a
#: lost notification (rare: the bus also wakes every connection after it
#: reconnects) costs them latency only.
GET_CHECK_FACTOR = 10

#: Store reads of live connections in flight at once, per replica: however many
#: clients are attached, the replica's connection pool does not grow for them.
LIVE_READS = 8

#: Seconds an end claim is remembered (long after any client gave up on the stream).
_END_MEMORY = 3600.0

Handler = Callable[[dict[str, Any]], None]


class Replica:
    """This process's end of the replica set of one store."""

    def __init__(
        self,
        buffer: ReplayBuffer,
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        store_timeout: float = DEFAULT_STORE_TIMEOUT,
    ) -> None:
        if lease_ttl <= 0 or check_interval <= 0 or store_timeout <= 0:
            raise ValueError("lease_ttl, check_interval and store_timeout must be positive")
        self.store_timeout = store_timeout
        self.id = uuid.uuid4().hex[:12]
        self.buffer = buffer
        self.lease_ttl = lease_ttl
        self.check_interval = check_interval
        self.reads = anyio.CapacityLimiter(LIVE_READS)
        self.registry: Registry = registry_for(buffer)
        self.bus: Bus = bus_for(buffer, self.id, self._on_message)
        self.views: dict[str, SessionEventStore] = {}
        self._leases: dict[tuple[str, str], None] = {}
        self._touched: dict[str, float] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        #: Set by the session manager: a session ended elsewhere (forget it here).
        self.on_end: Callable[[str], None] | None = None
        #: Set by the session manager: a client message for a request running here.
        self.on_forward: Callable[[str, str], None] | None = None
        #: Set by the session manager: another replica took a stream over.
        self.on_takeover: Callable[[str, str], None] | None = None

    @property
    def running(self) -> bool:
        return self._task_group is not None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Listen to the other replicas and renew leases while the app runs."""
        async with anyio.create_task_group() as tg:
            await tg.start(self._run_bus)
            tg.start_soon(self._renew_loop)
            self._task_group = tg
            try:
                yield
            finally:
                self._task_group = None
                await self._release_all()
                tg.cancel_scope.cancel()

    def spawn(self, func: Callable[..., Any], *args: Any) -> None:
        """Run housekeeping in the background (dropped when the replica is not running)."""
        if self._task_group is not None:
            self._task_group.start_soon(func, *args)

    # ---------------------------------------------------------------- leases

    async def acquire(self, session: str, stream: str) -> None:
        """Take the lease of a request about to run here (raises :class:`StorageError`).

        Also keeps the session's record from expiring while the session is in
        use (at most one refresh per quarter of its lifetime).
        """
        await self.registry.acquire(session, stream, self.id, self.lease_ttl)
        self._leases[(session, stream)] = None
        ttl = self.buffer.retention.session_ttl
        now = time.monotonic()
        if ttl and now - self._touched.get(session, 0.0) > ttl / 4:
            self._touched[session] = now
            await self.registry.touch_session(session, ttl)

    def release(self, session: str, stream: str) -> None:
        """The request's response is stored: drop its lease (in the background)."""
        if self._leases.pop((session, stream), 0) is None:
            self.spawn(self._release, session, stream)

    def release_session(self, session: str) -> None:
        """The session is no longer served here: its unanswered requests stopped with it.

        Their leases are dropped at once, so a replica following one of those
        streams answers it as lost without waiting for the lease to lapse.
        """
        self._touched.pop(session, None)
        for key in [key for key in self._leases if key[0] == session]:
            del self._leases[key]
            self.spawn(self._abandon, *key)

    async def _release(self, session: str, stream: str) -> None:
        try:
            await self.registry.release(session, stream, self.id)
        except StorageError as exc:
            logger.debug("lease of %s/%s not released: %s", session, stream[:64], exc)

    async def _abandon(self, session: str, stream: str) -> None:
        try:
            await self.registry.abandon(session, stream, self.id)
        except StorageError as exc:
            logger.debug("lease of %s/%s not dropped: %s", session, stream[:64], exc)

    async def _release_all(self) -> None:
        """At shutdown: let other replicas end our unanswered requests at once (bounded)."""
        leases, self._leases = list(self._leases), {}
        if not leases:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
            for session, stream in leases:
                await self._abandon(session, stream)

    async def _renew_loop(self) -> None:
        while True:
            await anyio.sleep(self.lease_ttl / 3)
            held = list(self._leases)
            if not held:
                continue
            try:
                kept = await self.registry.renew(held, self.id, self.lease_ttl)
            except StorageError as exc:
                logger.warning("could not renew %d request leases: %s", len(held), exc)
                continue
            for key, ok in zip(held, kept, strict=True):
                if not ok and key in self._leases:
                    logger.warning(
                        "lease of request %r of session %s lapsed while it ran here",
                        key[1][:64],
                        key[0],
                    )

    async def lease_lapsed(self, session: str, stream: str) -> bool:
        """True if no replica holds the lease of ``stream`` (and this one does not run it)."""
        if (session, stream) in self._leases:
            return False
        return await self.registry.owner(session, stream) is None

    async def finished(self, session: str, stream: str) -> bool:
        """True if the request of ``stream`` was answered (its response is stored)."""
        if (session, stream) in self._leases:
            return False
        return await self.registry.owner(session, stream) == FINISHED

    async def claim_end(self, session: str, stream: str) -> bool:
        return await self.registry.claim_end(session, stream, _END_MEMORY)

    # ---------------------------------------------------------------- notifications

    async def _run_bus(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        await self.bus.run(task_status=task_status)

    def wake(self, session: str, stream: str) -> None:
        """An event of ``stream`` was appended here: wake local and remote connections."""
        view = self.views.get(session)
        if view is not None:
            view.wake_local(stream)
        self.bus.wake(session, stream)

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("t")
        session = message.get("s")
        if not isinstance(session, str) and kind != "gap":
            return
        session = str(session)
        if kind == "wake":
            view = self.views.get(session)
            stream = message.get("q")
            if view is not None and isinstance(stream, str):
                view.wake_local(stream)
        elif kind == "gap":  # notifications may have been lost: every live connection re-reads
            for view in list(self.views.values()):
                view.wake_all()
        elif kind == "end":
            if self.on_end is not None:
                self.on_end(session)
        elif kind == "takeover":
            stream = message.get("q")
            if self.on_takeover is not None and isinstance(stream, str):
                self.on_takeover(session, stream)
        elif kind == "fwd":
            body = message.get("m")
            if self.on_forward is not None and isinstance(body, str):
                self.on_forward(session, body)

    async def announce_end(self, session: str) -> None:
        await self.bus.broadcast({"t": "end", "s": session})

    async def announce_takeover(self, session: str, stream: str) -> None:
        await self.bus.broadcast({"t": "takeover", "s": session, "q": stream})

    async def forward(self, replica: str, session: str, body: bytes) -> None:
        await self.bus.send(replica, {"t": "fwd", "s": session, "m": body.decode("utf-8")})

"""One server process's membership in a set of replicas sharing a store.

A :class:`Replica` has an id, the session registry and the notification bus
of its store's coordination (:mod:`replaystore.backends.coordination`), the
leases of the requests it runs (renewed by one background task), and the live
connections of the sessions it currently serves, to which it hands wake-ups;
session ends, takeovers and forwarded messages from the other replicas go to
the session manager (:class:`Sessions`, given at construction), and so do the
error responses of requests stopped by a store outage. Nothing here
needs configuration: processes (or apps) on one buffer URL are replicas of
each other.

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

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import anyio.abc

from ...backends.coordination import Coordination
from ...backends.notifications import Bus, End, Forward, Gap, Message, Takeover, Wake
from ...backends.session_registry import FINISHED, Registry
from ...errors import StorageError
from ..metrics import count_drain
from ..settings import Settings

__all__ = ["END_MEMORY", "Followers", "Replica", "Sessions"]

logger = logging.getLogger("replaystore.mcp")

#: Seconds a replica keeps trying to answer, once the store is back, the requests an outage ended.
_OUTAGE_PATIENCE = 600.0

#: Seconds an end claim is remembered (long after any client gave up on the stream).
END_MEMORY = 3600.0


class Sessions(Protocol):
    """What a replica tells the session manager of its process (given at construction)."""

    def ended_elsewhere(self, session: str) -> None:
        """``session`` ended on another replica: forget it here."""

    def forwarded(self, session: str, body: str) -> None:
        """A client message (JSON text) for a request of ``session`` running here."""

    def taken_over(self, session: str, stream: str) -> None:
        """A newer connection took ``stream`` over: close the one carrying it here."""

    async def end_request(self, session: str, stream: str, message: str) -> None:
        """Store ``message`` as the error response of a request that stopped unanswered.

        Raises :class:`StorageError` while the store is out of reach (the
        replica tries again).
        """


class Followers(Protocol):
    """The live connections of one session on this replica (what a wake-up reaches)."""

    def wake(self, sequence: str) -> None:
        """New events of ``sequence`` may be in the store."""

    def wake_all(self) -> None:
        """Notifications may have been lost: every live connection re-reads the store."""


class Replica:
    """This process's end of the replica set of one store."""

    def __init__(
        self,
        coordination: Coordination,
        sessions: Sessions,
        settings: Settings | None = None,
        *,
        session_ttl: float | None = None,
    ) -> None:
        """A replica of the store ``coordination`` belongs to.

        ``session_ttl``: how long the store keeps an unused session (its
        retention's), refreshed while its requests run.
        """
        self.settings = settings if settings is not None else Settings()
        self.id = uuid.uuid4().hex[:12]
        self.coordination = coordination
        self.session_ttl = session_ttl
        self.sessions = sessions
        self.reads = anyio.CapacityLimiter(self.settings.live_reads)
        self.registry: Registry = coordination.registry()
        self.bus: Bus = coordination.bus(self.id, self._on_message)
        #: The live connections of each session served here, by session id.
        self.followers: dict[str, Followers] = {}
        self._leases: dict[tuple[str, str], None] = {}
        #: Requests whose lease write went unanswered here (the store stalled), refused, never
        #: run, and when: a lease of theirs that lands late may be taken over by a copy.
        self._unrun: dict[tuple[str, str], float] = {}
        #: Requests whose lease this replica let go of unanswered, and when: stopped while
        #: they ran, or given back (a drop that may land late): never taken over.
        self._stopped: dict[tuple[str, str], float] = {}
        self._touched: dict[str, float] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        #: Set once the process is shutting down: new requests are refused
        #: (503, ``Retry-After``) so that a balancer sends them elsewhere, while
        #: the requests already running here finish.
        self.draining = False
        #: The last refusal of the store that waiting cannot cure (its ACL
        #: forbids a command, key or channel): the health check says so until
        #: the store grants what was refused.
        self.refused: StorageError | None = None
        self._renew_now = anyio.Event()

    @property
    def running(self) -> bool:
        return self._task_group is not None

    @property
    def leases_held(self) -> int:
        """Leases of requests running here."""
        return len(self._leases)

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Listen to the other replicas and renew leases while the app runs."""
        async with anyio.create_task_group() as tg:
            await tg.start(self._run_bus)
            tg.start_soon(self._renew_loop)
            tg.start_soon(self._look_back_loop)
            self._task_group = tg
            try:
                yield
            finally:
                self._task_group = None
                if self.draining:
                    count_drain("handed_over" if self._leases else "finished")
                await self._release_all()
                tg.cancel_scope.cancel()

    def spawn(self, func: Callable[..., Any], *args: Any) -> None:
        """Run housekeeping in the background (dropped when the replica is not running)."""
        if self._task_group is not None:
            self._task_group.start_soon(func, *args)

    # ---------------------------------------------------------------- leases

    async def acquire(self, session: str, stream: str) -> bool:
        """Take the lease of a request about to run here (raises :class:`StorageError`).

        False when a replica (this one or another) already took it: the
        request was received before (a balancer sent the POST again) and must
        not run twice. Also keeps the session's record from expiring while the
        session is in use (at most one refresh per quarter of its lifetime).
        """
        key = (session, stream)
        try:
            taken = await self.registry.acquire(session, stream, self.id, self.settings.lease_ttl)
        except BaseException:
            # Unanswered: the write may land late and leave this replica's
            # lease on a request that never runs here (see :meth:`take_over`).
            if key not in self._leases and key not in self._stopped:
                _remember(self._unrun, key)
            raise
        if not taken:
            return False
        self._unrun.pop(key, None)
        self._leases[key] = None
        ttl = self.session_ttl
        now = time.monotonic()
        if ttl and now - self._touched.get(session, 0.0) > ttl / 4:
            self._touched[session] = now
            await self.registry.touch_session(session, ttl)
        return True

    async def take_over(self, session: str, stream: str) -> bool:
        """Take the lease this replica left on a request it refused, never ran (True if taken).

        A lease write sent as the store stalled lands when it wakes, after
        the request was answered 503: the lease names this replica, and a
        copy sent again would find the request received before, though it
        never ran. This replica knows it: the lease is its own, no request
        here holds it, none here let go of it (stopped while running it, or
        gave it back: a drop that may land late), and the one that left it
        was refused. Taken over, it is renewed as any lease taken
        here; the caller still checks the request's stream is not stored.
        """
        key = (session, stream)
        if key not in self._unrun or key in self._leases or key in self._stopped:
            return False
        if await self.registry.owner(session, stream) != self.id:
            return False
        # Checked again after the read: of two copies here, one takes it.
        if self._unrun.pop(key, None) is None or key in self._leases or key in self._stopped:
            return False
        self._leases[key] = None
        return True

    async def give_back(self, session: str, stream: str) -> None:
        """Drop a lease just taken for a request that must not run here after all."""
        if self._leases.pop((session, stream), 0) is None:
            _remember(self._stopped, (session, stream))
            await self.registry.abandon(session, stream, self.id)

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
            _remember(self._stopped, key)
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

    def renew_soon(self) -> None:
        """Renew the leases now (the store answers again after an outage), not at the next tick."""
        self._renew_now.set()

    def end_after_outage(self, session: str, message: str) -> None:
        """The session is dropped here because the store failed: end its requests, once it is back.

        Each unanswered request of the session gets ``message`` as its error
        response (what the store did, not that a replica stopped); stored
        through the session manager (:meth:`Sessions.end_request`) as soon as
        the store answers again, under the same end claim other replicas use
        for lost requests, so exactly one is stored.
        """
        for key in [key for key in self._leases if key[0] == session]:
            del self._leases[key]
            _remember(self._stopped, key)
            self.spawn(self._end_after_outage, *key, message)

    async def _end_after_outage(self, session: str, stream: str, message: str) -> None:
        deadline = time.monotonic() + _OUTAGE_PATIENCE
        while True:
            try:
                await self.sessions.end_request(session, stream, message)
                return
            except StorageError:
                if time.monotonic() > deadline:
                    return
                await anyio.sleep(self.settings.check_interval)

    async def _renew_loop(self) -> None:
        ttl = self.settings.lease_ttl
        while True:
            with anyio.move_on_after(ttl / 3):
                await self._renew_now.wait()
            self._renew_now = anyio.Event()
            held = list(self._leases)
            if not held:
                continue
            try:
                kept = await self.registry.renew(held, self.id, ttl)
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

    async def _look_back_loop(self) -> None:
        """Whether the store went back in time, looked at once per check interval.

        Reads the store's marker (:meth:`Registry.look_back`), so that this
        replica knows the newest facts even when it served none of them, and
        sees a restore that cut no connection.
        """
        while True:
            # An outage is told by the requests it fails; the next look tries again.
            with contextlib.suppress(StorageError):
                await self.registry.look_back()
            await anyio.sleep(self.settings.check_interval)

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
        return await self.registry.claim_end(session, stream, END_MEMORY)

    # ---------------------------------------------------------------- notifications

    async def _run_bus(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        await self.bus.run(task_status=task_status)

    def wake(self, session: str, stream: str) -> None:
        """An event of ``stream`` was appended here: wake local and remote connections."""
        followers = self.followers.get(session)
        if followers is not None:
            followers.wake(stream)
        self.bus.wake(session, stream)

    def _on_message(self, message: Message) -> None:
        match message:
            case Wake(session, stream):
                followers = self.followers.get(session)
                if followers is not None:
                    followers.wake(stream)
            case Gap():  # notifications may have been lost: every live connection re-reads
                for followers in list(self.followers.values()):
                    followers.wake_all()
            case End(session):
                self.sessions.ended_elsewhere(session)
            case Takeover(session, stream):
                self.sessions.taken_over(session, stream)
            case Forward(session, body):
                self.sessions.forwarded(session, body)

    async def announce_end(self, session: str, holders: frozenset[str] | None = None) -> None:
        """Tell the replicas serving ``session`` that it ended (every replica: ``holders`` None).

        The registry names them (:meth:`Registry.end_session`); this replica
        knows already, and a replica never named holds nothing to end.
        """
        if holders is None:
            await self.bus.broadcast(End(session))
            return
        for replica in sorted(holders - {self.id}):
            await self.bus.send(replica, End(session))

    async def announce_takeover(self, session: str, stream: str) -> None:
        await self.bus.broadcast(Takeover(session, stream))

    async def forward(self, replica: str, session: str, body: bytes) -> None:
        await self.bus.send(replica, Forward(session, body.decode("utf-8")))


def _remember(memory: dict[tuple[str, str], float], key: tuple[str, str]) -> None:
    """Note ``key`` now, forgetting the notes older than :data:`END_MEMORY`."""
    now = time.monotonic()
    if memory and next(iter(memory.values())) < now - END_MEMORY:
        for old in [old for old, at in memory.items() if at < now - END_MEMORY]:
            del memory[old]
    memory.pop(key, None)
    memory[key] = now

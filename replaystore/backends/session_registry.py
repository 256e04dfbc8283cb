"""The session registry's contract: what any replica needs to serve a session, and request leases.

Kept next to the session's events, in the same store:

- **the session record**, written when ``initialize`` is answered: the
  negotiated protocol version and the client's ``initialize`` parameters (so
  another replica can rebuild the SDK's connection in its initialized
  state), the credential that created it, and the standalone GET stream's
  mark. A replica adopts a session only if its record exists: nothing is
  conjured from a client-chosen id. The record also names the replicas that
  serve the session (its creator, then each one that adopts it, under
  :func:`holder_field`), so its end is told to those replicas only: ending a
  session then costs the replicas that never held it nothing, however many
  there are.
- **leases**: the replica running a request holds a lease on its stream,
  renewed while it runs. A lease that lapses (replica killed, partition) lets
  another replica end the stream with an error response, once: the *end
  claim* is a set-if-absent marker.

A backend's coordination builds its registry
(:meth:`~replaystore.backends.coordination.Coordination.registry`): on Redis
every key of a session carries the session's hash tag, so on a cluster they
live in the slot of the session's events
(:mod:`replaystore.backends.redis.coordination.registry`); on
``memory://NAME`` every buffer of the process naming the store shares one
registry (:mod:`replaystore.backends.memory.registry`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

__all__ = ["FINISHED", "FINISHED_TTL", "Registry", "holder_field", "holders"]

#: The lease holder of a request whose response is stored: no replica runs it
#: any more, and it must not be ended as lost. Replica ids never look like this.
FINISHED = "-"

#: Seconds a finished request is remembered as such.
FINISHED_TTL = 3600.0

_HOLDER = "held:"


def holder_field(replica: str) -> str:
    """The record's field saying that ``replica`` serves the session."""
    return _HOLDER + replica


def holders(record: dict[str, str]) -> frozenset[str]:
    """The replicas a record names as serving its session."""
    return frozenset(name[len(_HOLDER) :] for name in record if name.startswith(_HOLDER))


class Registry(ABC):
    """Session records, leases and end claims of one store."""

    @abstractmethod
    async def put_session(self, session: str, fields: dict[str, str], ttl: float | None) -> None:
        """Create or replace the record of ``session`` (expiring after ``ttl`` seconds)."""

    @abstractmethod
    async def get_session(self, session: str) -> dict[str, str] | None:
        """The record, or None if the store does not know the session (or it ended).

        A record written before the store went back in time (restored from an
        older snapshot) ends its session, and reads as None, as in :meth:`hold`.
        """

    async def look_back(self) -> None:
        """Look whether the store went back in time (restored from an older snapshot).

        Each replica calls it once per check interval; a store that cannot
        go back (one living in this process) has nothing to look at.
        """
        return

    @abstractmethod
    async def update_session(self, session: str, fields: dict[str, str]) -> None:
        """Change fields of an existing record (never creates one)."""

    @abstractmethod
    async def raise_mark(self, session: str, name: str, mark: str) -> None:
        """Set the record's field ``name`` to the event id ``mark``, unless it holds a later one.

        Event ids of one session are compared by position (its positions only
        grow), in one atomic step with the write: replicas saving the marks
        they delivered, in whatever order their writes land, never move the
        stored mark back. A field that does not parse as an event id is
        replaced; a record that does not exist is not created.
        """

    @abstractmethod
    async def touch_session(self, session: str, ttl: float) -> None:
        """Push the record's expiry back."""

    @abstractmethod
    async def drop_session(self, session: str) -> None:
        """Forget the record: every replica answers 404 for the session from now on."""

    async def hold(self, session: str, replica: str) -> dict[str, str] | None:
        """Name ``replica`` in the record as serving the session, and read the record.

        ``None`` (and nothing created) when there is no record: a replica
        that adopts a session just ended learns it here, and does not serve
        it. Naming and reading are one step, so an adoption costs no round
        trip more than reading the record. (Override it to do this
        atomically, and :meth:`end_session` too; this default only reads,
        names nobody, and its :meth:`end_session` then tells every replica.)
        """
        return await self.get_session(session)

    async def end_session(self, session: str) -> frozenset[str] | None:
        """Forget the record, as :meth:`drop_session`, and say which replicas served the session.

        In one atomic step with the read, so that a replica adopting the
        session meanwhile either is named here or learns from :meth:`hold`
        that it ended. ``None`` when it cannot say (no record, a record
        written before records named their replicas, or this default): every
        replica is then told.
        """
        await self.drop_session(session)
        return None

    @abstractmethod
    async def acquire(self, session: str, stream: str, owner: str, ttl: float) -> bool:
        """Take the lease of a request's stream for ``ttl`` seconds, if nobody holds it.

        One atomic set-if-absent: of two replicas receiving the same request
        at once (a balancer retrying a POST), exactly one gets True and runs
        it. False while another replica runs it, or once it was answered
        (:data:`FINISHED`).
        """

    @abstractmethod
    async def renew(self, leases: Iterable[tuple[str, str]], owner: str, ttl: float) -> list[bool]:
        """Extend leases held by ``owner``; False where the lease was lost."""

    @abstractmethod
    async def release(self, session: str, stream: str, owner: str) -> None:
        """The request was answered: its lease becomes :data:`FINISHED` (if ``owner`` held it)."""

    @abstractmethod
    async def abandon(self, session: str, stream: str, owner: str) -> None:
        """The request stopped unanswered here: drop the lease (if ``owner`` held it)."""

    @abstractmethod
    async def owner(self, session: str, stream: str) -> str | None:
        """The replica holding a stream's lease, :data:`FINISHED`, or None (lapsed, unknown)."""

    @abstractmethod
    async def claim_end(self, session: str, stream: str, ttl: float) -> bool:
        """True for exactly one caller: the one that ends a stream whose lease lapsed."""

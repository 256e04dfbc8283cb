"""Replica coordination: an optional capability a backend declares, as a set of factories.

Replicas of an MCP server sharing one store need more than the five
operations of :class:`~replaystore.backends.Backend`: a session registry and
request leases kept next to the events, a channel to notify each other,
durable task records, the key sealing ``requestState``, and the events of
``subscriptions/listen`` in one order. Not every store can offer that, so it
is a capability a backend declares, the way centrifuge's brokers declare
their optional features: a backend has a ``coordination()`` method returning
a :class:`Coordination`, the object that builds each of these parts on its
store. The MCP layer asks that object for what it needs and never looks at
which store it is; it refuses a backend without one, naming it, instead of
silently keeping a registry that replicas in other processes would never see.

The built-in backends each return theirs, found beside them:
``replaystore.backends.memory.InProcess`` (every replica sharing
the store runs in this process; a third-party backend whose data never
leaves the process can return it too) and
``replaystore.backends.redis.coordination.OnRedis`` (registry keys beside the
session's events, pub/sub notifications; a backend storing its events in
Redis, Valkey or a cluster can return it too).

The contracts of the parts it builds live below the MCP layer, so a
third-party backend implements them without importing it:
:mod:`replaystore.backends.session_registry`,
:mod:`replaystore.backends.notifications`, :mod:`replaystore.taskstore.store`
and :class:`EventLog` here.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..taskstore.store import TaskStore
    from .notifications import Bus, Handler
    from .session_registry import Registry

__all__ = ["Coordinated", "Coordination", "EventLog", "coordination_of"]


class EventLog(Protocol):
    """Events every replica of a store reads in one order (``subscriptions/listen``'s).

    Each replica reads every event once, its own included, in publication
    order; ``gaps`` counts the events this replica knows it missed (fell
    further behind than the store keeps), counted before the first event
    after them is delivered (so a reader of ``gaps`` in ``deliver`` learns of
    a loss before the event that revealed it).
    """

    gaps: int

    async def publish(self, text: str) -> None:
        """Append ``text`` for every replica; raises ``StorageError`` when the store refuses."""
        ...

    def reading(self, deliver: Callable[[str], None]) -> AbstractAsyncContextManager[None]:
        """Hand ``deliver`` every event published after entering, until the context exits."""
        ...


@runtime_checkable
class Coordination(Protocol):
    """What a backend provides so that replicas sharing its store coordinate through it.

    Each factory builds a part on the backend's store; the MCP layer calls
    them and nothing else. ``spans_processes``: whether replicas in other
    processes may share the store (what a setting keeping state per process,
    such as ``share=False``, is warned about).
    """

    @property
    def spans_processes(self) -> bool: ...

    def registry(self) -> Registry:
        """Session records, request leases and end claims, beside the sessions' events."""
        ...

    def bus(self, replica: str, handler: Handler) -> Bus:
        """Replica ``replica``'s end of the notification channels; ``handler`` gets what arrives."""
        ...

    def task_store(
        self, *, namespace: str = "", wait_replicas: int = 0, wait_timeout: float = 1.0
    ) -> TaskStore:
        """Durable task records, beside the sessions (see :mod:`replaystore.taskstore`).

        ``namespace``: whose tasks these are (the app serving them); stores
        of different namespaces share nothing. ``wait_replicas``: a status
        change counts once that many of the store's replicas acknowledged it,
        within ``wait_timeout`` seconds (a store without replicas ignores it).
        """
        ...

    def listen_events(self, *, keep: int, block: float | None) -> EventLog:
        """The ``subscriptions/listen`` events of the store.

        ``keep``: events kept (how far a replica may fall behind); ``block``:
        how long one read waits for new events (None: as long as the store's
        client allows). A store delivering directly ignores both.
        """
        ...

    async def request_state_key(self, candidate: str) -> tuple[str, bool]:
        """The key every replica seals ``requestState`` under, and whether this call stored it.

        ``candidate`` is stored if the store holds none, in one set-if-absent
        step; the stored key is returned either way, with True when it is
        ``candidate``, stored by this call (a replica that held a key then
        knows the store had lost it).
        """
        ...

    async def first_use(self, digest: str, ttl: float) -> str | None:
        """Record ``digest`` for ``ttl`` seconds; None for the first call that records it.

        One set-if-absent step in the store every replica shares: of any
        number of calls with one digest, on any replica, within ``ttl``,
        exactly one gets None (a ``requestState`` used once); every other
        gets what :meth:`keep_answer` kept for it since ("" until then).
        Raises ``StorageError`` when the store does not answer or refuses.
        """
        ...

    async def keep_answer(self, digest: str, answer: str, ttl: float) -> None:
        """Keep ``answer`` beside a recorded ``digest``, for ``ttl`` seconds (none kept if the
        digest is no longer recorded); raises ``StorageError`` like :meth:`first_use`."""
        ...

    async def probe(self, replica: str, *, subscribe: bool = False) -> None:
        """Ask the store for what notifications need: a publish on ``replica``'s probe channel.

        With ``subscribe``, a subscription to that channel instead. Raises
        the ``StorageError`` of the refusal; a store whose replicas call each
        other directly has nothing to ask.
        """
        ...

    async def eviction_warning(self) -> str | None:
        """One line when the store may evict what replicas keep in it, else None."""
        ...

    async def purge(self, session: str) -> None:
        """Delete everything the store keeps of ``session``, tombstone included.

        For a throwaway session in a store other processes share (the demo);
        a store living in this process only has nothing to leave behind.
        """
        ...


@runtime_checkable
class Coordinated(Protocol):
    """A backend that declares how replicas sharing its store coordinate."""

    def coordination(self) -> Coordination:
        """How replicas using this backend's store find and notify each other."""
        ...


def coordination_of(backend: object) -> Coordination:
    """The coordination ``backend`` declares; ``TypeError`` naming it when it declares none."""
    if isinstance(backend, Coordinated):
        declared = backend.coordination()
        if isinstance(declared, Coordination):
            return declared
        raise TypeError(
            f"{type(backend).__qualname__}.coordination() returned {declared!r}, "
            "not a replaystore.backends.coordination.Coordination"
        )
    raise TypeError(
        f"the {type(backend).__module__}.{type(backend).__qualname__} backend does not declare "
        "replica coordination: MCP replicas need a session registry and notifications "
        "shared through the store. Give the backend a coordination() method returning a "
        "replaystore.backends.coordination.Coordination: "
        "replaystore.backends.memory.InProcess (every replica in this process), "
        "replaystore.backends.redis.coordination.OnRedis (a Redis shared by every replica), "
        "or one of its own"
    )

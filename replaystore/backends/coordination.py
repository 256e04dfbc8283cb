"""Replica coordination: an optional capability a backend declares.

Replicas of an MCP server sharing one store need more than the five
operations of :class:`~replaystore.backends.Backend`: a session registry and
request leases kept next to the events, and a channel to notify each other
(see :mod:`replaystore.mcp.replicas.replica`). Not every store can offer that, so it is
a capability a backend declares, the way centrifuge's brokers declare their
optional features: a backend has a ``coordination()`` method returning how
its replicas reach each other. The MCP layer's ``Replica`` refuses a
backend without one, naming it, instead of silently keeping a registry that
replicas in other processes would never see.

Two ways are understood:

- :class:`InProcess`: every replica sharing the store runs in this process
  (``memory://NAME``); they call each other directly. A third-party backend
  whose data never leaves the process can declare this too.
- :class:`OnRedis`: the registry lives in Redis keys beside the session's
  events and notifications travel over Redis pub/sub; a backend storing its
  events in Redis (or Valkey, or a cluster) declares its client, key prefix
  and session key base.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Coordinated", "Coordination", "InProcess", "OnRedis", "coordination_of"]


@dataclass(frozen=True, slots=True, eq=False)
class InProcess:
    """Replicas sharing ``scope`` (the backend's store object) all run in this process."""

    scope: object


@dataclass(frozen=True, slots=True, eq=False)
class OnRedis:
    """Replicas share a Redis: ``client`` (redis-py asyncio), the key ``prefix``, and
    ``key_base(session)``, the hash-tagged base of a session's keys (coordination
    keys go behind it, so on a cluster they land in the slot of the session's events).
    """

    client: Any
    prefix: str
    key_base: Callable[[str], str]


#: How a backend's replicas reach each other.
Coordination = InProcess | OnRedis


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
        if isinstance(declared, InProcess | OnRedis):
            return declared
        raise TypeError(
            f"{type(backend).__qualname__}.coordination() returned {declared!r}, "
            "not replaystore.backends.coordination.InProcess or OnRedis"
        )
    raise TypeError(
        f"the {type(backend).__module__}.{type(backend).__qualname__} backend does not declare "
        "replica coordination: MCP replicas need a session registry and notifications "
        "shared through the store. Give the backend a coordination() method returning "
        "replaystore.backends.coordination.InProcess (every replica in this process) or "
        "OnRedis (a Redis shared by every replica)"
    )

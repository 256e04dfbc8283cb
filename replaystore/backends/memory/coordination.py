"""How replicas sharing a ``memory://`` store coordinate: they all run in this process.

:class:`InProcess` is what :class:`~replaystore.backends.memory.MemoryBackend`
declares; each part it builds is kept per store object (``scope``), so every
buffer of the process naming the store (``memory://NAME``) shares it. A
third-party backend whose data never leaves the process can declare it too,
with its own store object as the scope.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...taskstore.store import TaskStore
    from ..notifications import Bus, Handler
    from ..session_registry import Registry
    from .listen import MemoryEventLog

__all__ = ["InProcess"]

_KEYS: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
_KEYS_LOCK = threading.Lock()
#: Per store: the digests recorded by ``first_use``: when each is forgotten, the answer kept.
_USED: weakref.WeakKeyDictionary[object, dict[str, tuple[float, str]]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, slots=True, eq=False)
class InProcess:
    """Replicas sharing ``scope`` (the backend's store object) all run in this process.

    Each part is imported when first built: a buffer that serves no MCP
    replicas loads none of them, and an app without tasks no task store.
    """

    scope: object
    #: Replicas in other processes never see this store.
    spans_processes = False

    def registry(self) -> Registry:
        from .registry import MemoryRegistry

        return MemoryRegistry(self.scope)

    def bus(self, replica: str, handler: Handler) -> Bus:
        from .bus import MemoryBus

        return MemoryBus(replica, handler, self.scope)

    def task_store(
        self, *, namespace: str = "", wait_replicas: int = 0, wait_timeout: float = 1.0
    ) -> TaskStore:
        """Tasks under one lock per operation (no replicas to wait for: those are ignored)."""
        from .tasks import MemoryTaskStore

        return MemoryTaskStore(self.scope, namespace=namespace)

    def listen_events(self, *, keep: int, block: float | None) -> MemoryEventLog:
        """Every reader called at once: nothing is kept, nothing waited for (both ignored)."""
        from .listen import MemoryEventLog

        return MemoryEventLog(self.scope)

    async def request_state_key(self, candidate: str) -> tuple[str, bool]:
        with _KEYS_LOCK:
            stored = _KEYS.setdefault(self.scope, candidate)
        return stored, stored is candidate

    async def first_use(self, digest: str, ttl: float) -> str | None:
        now = time.monotonic()
        with _KEYS_LOCK:
            used = _USED.setdefault(self.scope, {})
            until, kept = used.get(digest, (0.0, ""))
            if until > now:
                return kept
            if len(used) % 1024 == 1023:  # forgotten in bulk: each call stays O(1) on average
                for old in [d for d, (end, _) in used.items() if end <= now]:
                    del used[old]
            used[digest] = (now + ttl, "")
            return None

    async def keep_answer(self, digest: str, answer: str, ttl: float) -> None:
        now = time.monotonic()
        with _KEYS_LOCK:
            used = _USED.setdefault(self.scope, {})
            if used.get(digest, (0.0, ""))[0] > now:
                used[digest] = (now + ttl, answer)

    async def probe(self, replica: str, *, subscribe: bool = False) -> None:
        """Replicas call each other directly: no channel to ask for."""

    async def eviction_warning(self) -> None:
        """Nothing is evicted behind the backend's back."""

    async def purge(self, session: str) -> None:
        """The store lives in this process only: nothing outlives it elsewhere."""

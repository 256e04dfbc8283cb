"""``subscriptions/listen`` events of a ``memory://`` store: every reader of the process, called.

Every log of the process built on one store object is called in publication
order, the publisher's own included, so each reader sees every event once,
as a reader of the Redis stream does. Nothing is kept: there is nothing to
fall behind on (``gaps`` stays 0).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio.lowlevel

__all__ = ["MemoryEventLog"]


class _Readers:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deliver: dict[object, Callable[[str], None]] = {}


_READERS: weakref.WeakKeyDictionary[object, _Readers] = weakref.WeakKeyDictionary()
_READERS_LOCK = threading.Lock()


class MemoryEventLog:
    """The listen events of the store ``scope``, shared by every log built on it."""

    def __init__(self, scope: object) -> None:
        with _READERS_LOCK:
            readers = _READERS.get(scope)
            if readers is None:
                readers = _READERS[scope] = _Readers()
        self._readers = readers
        self.gaps = 0

    async def publish(self, text: str) -> None:
        with self._readers.lock:
            deliver = list(self._readers.deliver.values())
        for call in deliver:
            call(text)
        await anyio.lowlevel.checkpoint()

    @asynccontextmanager
    async def reading(self, deliver: Callable[[str], None]) -> AsyncIterator[None]:
        token = object()
        with self._readers.lock:
            self._readers.deliver[token] = deliver
        try:
            yield
        finally:
            with self._readers.lock:
                self._readers.deliver.pop(token, None)

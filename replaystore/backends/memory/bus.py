"""Notifications between the replicas of one process sharing a ``memory://`` store.

Replicas sharing the store object call each other directly: a wake-up, a
broadcast or a forwarded message is delivered before the call returns.
"""

from __future__ import annotations

import weakref

import anyio
import anyio.abc

from ..notifications import Bus, Handler, Message, Wake

__all__ = ["MemoryBus"]


class _Group:
    def __init__(self) -> None:
        self.members: weakref.WeakSet[MemoryBus] = weakref.WeakSet()


_GROUPS: weakref.WeakKeyDictionary[object, _Group] = weakref.WeakKeyDictionary()


class MemoryBus(Bus):
    """The replicas of one process sharing a memory store."""

    def __init__(self, replica: str, handler: Handler, key: object) -> None:
        super().__init__(replica, handler)
        group = _GROUPS.get(key)
        if group is None:
            group = _GROUPS[key] = _Group()
        self._group = group

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._group.members.add(self)
        try:
            task_status.started()
            await anyio.sleep_forever()
        finally:
            self._group.members.discard(self)

    async def _subscribe(self, session: str) -> None:
        pass

    async def _unsubscribe(self, session: str) -> None:
        pass

    def wake(self, session: str, stream: str) -> None:
        message = Wake(session, stream)
        for member in list(self._group.members):
            if member is not self and session in member._watching:
                member._deliver(message, self.replica)

    async def broadcast(self, message: Message) -> None:
        for member in list(self._group.members):
            if member is not self:
                member._deliver(message, self.replica)

    async def send(self, replica: str, message: Message) -> None:
        for member in list(self._group.members):
            if member.replica == replica:
                member._deliver(message, self.replica)

"""Many deadlines kept by one event-loop timer: each key expired at its own, none armed per key.

A timer of the event loop's own, armed and then cancelled for every store
call, costs more than the rest of a short call's client time (uvloop opens
and closes a libuv handle for each). Here a call only notes its deadline,
and one callback, armed for the earliest deadline noted, expires the keys
whose deadline it reached and arms itself again for the next: each key
still expires at its own deadline, and the loop holds one timer. Used for
the Redis wire's exchanges and for a resume's bounded reads.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Deadlines"]

K = TypeVar("K", bound=Hashable)


class Deadlines(Generic[K]):
    """Deadlines of keys of one kind, each expired by ``expire(key)`` when reached."""

    def __init__(self, expire: Callable[[K], None]) -> None:
        self._expire = expire
        self._due: dict[K, float] = {}  # the keys under way, and when each expires
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._at = math.inf  # when the timer fires (inf: not armed)

    def start(self, key: K, timeout: float) -> None:
        """``key`` expires ``timeout`` seconds from now, unless stopped first."""
        loop = asyncio.get_running_loop()
        at = loop.time() + timeout
        self._due[key] = at
        if at < self._at or loop is not self._loop:
            self._arm(loop, at)

    def stop(self, key: K) -> None:
        """``key`` ended (or expired): it is not expired again."""
        self._due.pop(key, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        timer, old = self._timer, self._loop
        if timer is not None and old is not None and not old.is_closed():
            timer.cancel()
        self._loop, self._at = loop, at
        self._timer = loop.call_at(at, self._fire)

    def _fire(self) -> None:
        loop = self._loop
        assert loop is not None
        reached = max(self._at, loop.time())  # the loop may run a timer a little early
        self._timer, self._at = None, math.inf
        due = self._due
        for key, at in list(due.items()):
            if at <= reached:
                del due[key]
                self._expire(key)
        if due:
            self._arm(loop, min(due.values()))

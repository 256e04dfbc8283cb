"""Connections kept between calls, over the client's own redis-py pool.

A call's connection is kept, not given back to the pool: the next call takes
it without the pool's locks, condition and bookkeeping, which cost more client
time than a short resume's own work. Every kept connection goes back
:data:`IDLE_S` to twice that after the last call in flight ends (the wait
starts again while calls keep coming), unless a call takes it first
(calls come in bursts that end together: given back as the last one ends,
each burst took most of its connections from the pool again), and a
connection is not kept at all while the pool has none left to give (a call of
this or any other user of the client waits for one), so the pool's bound and
its waiters see what they would see without the keeping, at most twice
:data:`IDLE_S` late. (Figures: ``docs/benchmarks.md``, "The wire's choices".)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .exchange import drop, sound

__all__ = ["IDLE_S", "KeptConnections"]

#: How long kept connections wait for the next call once none is in flight,
#: before they go back to the pool. A burst of calls ends together: given back
#: at once, nearly every burst would take its connections from the pool again.
#: Between bursts a replica's calls can be a millisecond or more apart (one
#: resume at a time, replicas sharing cores with their clients): a shorter
#: wait gave the connection back after nearly every resume, and each give-back
#: cost a timer wake-up, a task and two trips through the pool's locks. The
#: price of a longer wait: another user of the client that finds the pool
#: empty waits for a kept connection at most twice this long (none is kept while
#: the pool has none left to give).
IDLE_S = 0.05


class KeptConnections:
    """The connections of one backend's calls on one server: taken, kept, given back.

    ``in_flight`` counts the calls between taking a connection and giving it
    back (and the callers :meth:`held`): while it is above zero, kept
    connections stay kept. ``settle`` waits for the calls under way that
    took no connection yet (shared packets about to go), before the kept
    ones go back.
    """

    def __init__(self, client: Any, settle: Callable[[], Awaitable[None]]) -> None:
        self._pool = client.connection_pool
        self._settle = settle
        self.in_flight = 0
        self.ends = 0  # calls ended so far: the idle timer tells from it whether any came
        self._ends_armed = 0  # ``ends`` when the idle timer was set
        self.kept: list[Any] = []
        self._idle: asyncio.TimerHandle | None = None  # gives them back unless a call comes
        self._giving: set[asyncio.Task[None]] = set()

    def kept_one(self) -> Any:
        """A kept connection that is still sound, taken for one call as :meth:`take` would
        take it, or None when :meth:`take` has more to do (no await: the common case)."""
        kept = self.kept
        if kept and sound(kept[-1]):
            self.in_flight += 1
            return kept.pop()
        return None

    async def take(self) -> Any:
        """A connection for one call: a kept one if any is still sound, else the pool's."""
        self.in_flight += 1
        taken = False
        try:
            kept = self.kept
            while kept:
                conn = kept.pop()
                if sound(conn):
                    taken = True
                    return conn
                await self._pool.release(conn)  # the pool repairs it
            conn = await self._pool.get_connection()
            taken = True
            return conn
        finally:
            if not taken:
                self.in_flight -= 1

    def keep(self, conn: Any) -> bool:
        """After a call: keep its connection for the next one; False when the pool has none
        left (others wait for one): the caller then hands it to them with :meth:`release`."""
        self.in_flight -= 1
        self.ends += 1
        if self._pool.can_get_connection():
            self.kept.append(conn)
            if not self.in_flight:
                self._idle_soon()
            return True
        return False

    async def release(self, conn: Any) -> None:
        """A connection :meth:`keep` did not keep, back to the pool."""
        await self._pool.release(conn)
        if not self.in_flight:
            self._idle_soon()

    async def give(self, conn: Any) -> None:
        """After a call: keep its connection for the next one, unless the pool has none left."""
        if not self.keep(conn):
            await self.release(conn)

    async def lose(self, conn: Any) -> None:
        """After a failed call: its connection is dropped, then given back (the pool reopens it)."""
        self.in_flight -= 1
        self.ends += 1
        try:
            await drop(conn)
        finally:
            await self._pool.release(conn)
        if not self.in_flight:
            self._idle_soon()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Count a caller as in flight while it waits on something else of this backend."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self.ends += 1
            if not self.in_flight:
                self._idle_soon()

    def _idle_soon(self) -> None:
        """Give every kept connection back unless a call takes one within :data:`IDLE_S`."""
        if self.kept and self._idle is None:
            self._ends_armed = self.ends
            self._idle = asyncio.get_running_loop().call_later(IDLE_S, self._idle_over)

    def _idle_over(self) -> None:
        self._idle = None
        if self.in_flight or not self.kept:
            return  # calls under way again: they use the kept ones
        if self.ends != self._ends_armed:
            # Calls came and went meanwhile: the wait starts again from now, so
            # connections go back IDLE_S to twice that after the last call ends,
            # not at a moment that falls between two calls of a steady stream
            # (one timer per period, not one per call).
            self._idle_soon()
            return
        task = asyncio.get_running_loop().create_task(self.give_back())
        self._giving.add(task)
        task.add_done_callback(self._giving.discard)

    async def give_back(self) -> None:
        """Every kept connection back to the pool, once the calls about to go are settled."""
        await self._settle()
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        kept, self.kept[:] = list(self.kept), []
        for conn in kept:
            await self._pool.release(conn)

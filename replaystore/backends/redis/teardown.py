"""A failed resume's teardown: the condition it holds under, and the lists it leaves for later.

A resume that fails must take its session down for every replica, and only
the incarnation it was judged on, only while its verdict still holds (a
compare-and-delete): ``fail.lua`` (after the fast read), ``close.lua`` (or
``facts.lua`` on the state it read) checks the incarnation and
:func:`still_true`'s condition, deletes the
session's fixed keys and the lists it declared, leaves the tombstone and
returns the tags of the session's other lists. Those are not declared in that
call, so it must not touch them; deleting each session's rest in a call of
its own would cost Redis a second script per failed resume. :class:`Leftovers`
collects them and deletes many sessions' at once, a moment later
(``drop.lua``). Nothing reads a torn-down session's lists, and a session
opened again under the same id keeps its own (``drop.lua`` leaves the lists
of a session whose meta hash exists alone); a process that stops before the
batch goes leaves them to expire with the session's TTL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...cursor import Cursor

__all__ = ["Leftovers", "still_true"]

logger = logging.getLogger("replaystore.redis")


def still_true(code: str, cursor: Cursor | None, named_tag: str) -> tuple[str, Any]:
    """The condition under which a failed verdict still holds (``fail.lua``, ``close.lua``).

    Appends and evictions go on while a resume is judged; the teardown applies
    only if they did not change the verdict, otherwise it is judged again.
    """
    position = cursor.position if cursor else 0
    if code in ("malformed", "foreign", "origin_evicted", "evicted"):
        return "always", ""  # the floor only rises, epochs never change
    if code == "ahead":
        return "top_below", position
    if code == "unknown_sequence":
        return "no_sequence", named_tag
    if code == "origin_ambiguous":
        return "ambiguous", ""
    return "floor_at_most", max(position, 1)


#: Sends ``drop.lua`` with these keys and arguments.
Drop = Callable[[list[str], list[Any]], Awaitable[Any]]


class Leftovers:
    """Lists of torn-down sessions, deleted in batches: after ``delay`` seconds or ``size`` keys.

    ``slot`` (on a cluster: a key's hash slot) splits the batches by slot,
    since a script's keys must share one; without it one call takes any
    sessions. A batch that
    fails is logged and given up: its lists expire with their session's TTL.
    """

    def __init__(
        self,
        drop: Drop,
        *,
        slot: Callable[[str], int] | None = None,
        delay: float = 0.05,
        size: int = 1000,
    ) -> None:
        self._drop = drop
        self._slot = slot
        self.delay = delay
        self.size = size
        self._pending: list[tuple[str, list[str]]] = []
        self._keys = 0
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        """Keys waiting for the next batch (meta hashes included)."""
        return self._keys

    def add(self, meta: str, lists: list[str]) -> None:
        """Delete ``lists`` later, if the session of meta hash ``meta`` is still gone then."""
        for start in range(0, len(lists), self.size):  # a script unpacks them all at once
            chunk = lists[start : start + self.size]
            self._pending.append((meta, chunk))
            self._keys += 1 + len(chunk)
        if not self._pending:
            return
        if self._keys >= self.size:
            self._start()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay, self._start)

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = asyncio.get_running_loop().create_task(self._flush_logged())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _flush_logged(self) -> None:
        try:
            await self.flush()
        except Exception as exc:  # the lists expire with their session anyway
            logger.warning("leftover lists of torn-down sessions not deleted: %s", exc)

    async def flush(self) -> None:
        """Send what is pending: a ``drop.lua`` call per ``size`` keys (per slot on a cluster)."""
        batch, self._pending, self._keys = self._pending, [], 0
        groups: dict[int, list[tuple[str, list[str]]]] = {}
        for meta, lists in batch:
            groups.setdefault(self._slot(meta) if self._slot else 0, []).append((meta, lists))
        for group in groups.values():
            keys: list[str] = []
            args: list[Any] = [0]
            for meta, lists in group:
                if keys and len(keys) + 1 + len(lists) > self.size:
                    await self._drop(keys, args)
                    keys, args = [], [0]
                keys += [meta, *lists]
                args.append(len(lists))
            await self._drop(keys, args)

    async def aclose(self) -> None:
        """Send what is pending and wait for every batch under way."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            self._start()
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

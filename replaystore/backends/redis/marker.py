"""The store's run marker: how every replica sees its store go back in time.

A Redis restarted from an older snapshot (RDB or AOF), a failover to a
replica that had not received the newest writes, an operator's restore: each
brings records back as they were, so a session ended since answers again and
a task reported finished reads as running, and nothing in a restored record
says so. The marker does. It is one hash (``<prefix>{store}:era``): a
random ``id`` (the store's *era*), written once, and ``n``, a count that every
lasting fact raises (a session ended, a task reaching a terminal status).
Each process remembers the era and the highest count it read or raised; the
same era with a lower count, another era declared before its own, or no
marker at all proves that the store lost writes it had answered.

The process that sees it first *declares* a new era (a new id, and ``at``,
the server's time of the declaration), in one step that re-reads the marker,
so two processes seeing the regression at once declare one era between them
and a reply that was merely overtaken by a newer one declares nothing. Every
other process learns of it at its next look: an era declared after its own.
What the store holds from before the declared era is not trusted from then
on: a session record carries the era it was written in (its ``era`` field)
and one of another era is refused with ``store_regressed``; a task created
before the declaration that is not terminal is ended ``failed`` and never
run again (:mod:`.coordination.tasks`); and each process ends the sessions it
was appending to (its fences, :mod:`.fences`).

A process looks at the marker in the packet of reads it sends anyway (a
session record read on adoption or on a resume of a session served
elsewhere, a task read or claim; one such read per :data:`FRESH` seconds),
after a lost connection (before its next append or resume), and once per
check interval in the background of a replica. ``docs/guarantees.md``
(section 12, restores) says what remains uncaught.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from ...errors import StorageError
from . import keys

__all__ = ["COUNT_LUA", "FRESH", "StoreMarker"]

#: Seconds a read of the marker stays fresh: a read made anyway (a session
#: record, a task) carries one only when the last is older, so a storm of
#: reads costs a few marker reads per second, not one each.
FRESH = 0.05

logger = logging.getLogger(__name__)

# The marker created when the store holds none (a new store), and read.
_LOOK = (
    "redis.call('HSETNX', KEYS[1], 'id', ARGV[1]) "
    "return redis.call('HMGET', KEYS[1], 'id', 'n', 'at')"
)
#: Lua counting one more lasting fact (the marker created if need be) on the marker
#: at key ``m`` (a local the enclosing script sets), ``ARGV[1]`` a fresh id: it
#: returns the marker's ``HMGET id n at``. Another script of the same server may
#: count in the step that makes the fact (the registry's end of a session does).
COUNT_LUA = (
    "redis.call('HSETNX', m, 'id', ARGV[1]) redis.call('HINCRBY', m, 'n', 1) "
    "return redis.call('HMGET', m, 'id', 'n', 'at')"
)
_COUNT = "local m = KEYS[1] " + COUNT_LUA
# ARGV: the era the caller holds, its count, its era's declaration time, a new id.
# Declares the new era only if the store went back: the caller's era with a
# lower count, an older era, or no marker. A newer era (declared by another
# process) or a count that caught up is returned as it is.
_DECLARE = """
local m = redis.call('HMGET', KEYS[1], 'id', 'n', 'at')
local id, n, at = m[1] or '', tonumber(m[2] or '0'), tonumber(m[3] or '0')
if id == ARGV[1] then
  if n >= tonumber(ARGV[2]) then return m end
elseif id ~= '' and at > tonumber(ARGV[3]) then
  return m
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'id', ARGV[4], 'at', t[1] * 1000 + math.floor(t[2] / 1000))
return redis.call('HMGET', KEYS[1], 'id', 'n', 'at')
"""


def _fresh() -> str:
    return secrets.token_hex(12)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _decode(reply: Any) -> tuple[str | None, int, int]:
    """``(id, n, at)`` from an ``HMGET id n at`` reply (a script's ``false`` read as none)."""
    stored, count, at = (_text(v) if v not in (None, False, 0) else None for v in reply)
    return stored, int(count or 0), int(float(at or 0))


class StoreMarker:
    """What this process saw of its store's marker: the era, its count, its declaration time."""

    __slots__ = ("_command", "_fresh_until", "_lock", "_reactions", "count", "era", "key", "since")

    def __init__(
        self,
        command: Callable[[tuple[Any, ...]], Awaitable[Any]],
        prefix: str,
        *reactions: Callable[[], Awaitable[None]],
    ) -> None:
        """``reactions``: called, as :meth:`on_regressed`, when the store went back."""
        self.key = keys.store_era(prefix)
        self._command = command
        #: The store's era as this process knows it (None until first read).
        self.era: str | None = None
        #: The highest count of lasting facts read or raised in this era.
        self.count = 0
        #: When the era was declared, in the server's milliseconds (0: the store's first era).
        self.since = 0
        self._reactions: list[Callable[[], Awaitable[None]]] = list(reactions)
        self._lock = anyio.Lock()
        self._fresh_until = 0.0

    def on_regressed(self, react: Callable[[], Awaitable[None]]) -> None:
        """Call ``react`` each time this process learns that the store went back."""
        self._reactions.append(react)

    def due(self) -> bool:
        """Whether a read made anyway should carry a read of the marker (:data:`FRESH`).

        True for one caller per :data:`FRESH` seconds: of reads sent at once,
        one carries it, not every one in flight before its reply is back.
        """
        now = time.monotonic()
        if now < self._fresh_until:
            return False
        self._fresh_until = now + FRESH
        return True

    @property
    def read(self) -> tuple[Any, ...]:
        """The plain read of the marker, to send in the packet of a read made anyway."""
        return ("HMGET", self.key, "id", "n", "at")

    async def look(self) -> None:
        """Read the marker and take it in (a plain read: served by a full or read-only store)."""
        await self.seen(await self._command(self.read))

    async def counted(self) -> None:
        """Count one more lasting fact (a session ended, a task ended) and take the reply in."""
        await self.seen(await self._command(("EVAL", _COUNT, 1, self.key, _fresh())))

    @staticmethod
    def fresh() -> str:
        """A new era's id, for a script that counts with :data:`COUNT_LUA` (``ARGV[1]``)."""
        return _fresh()

    async def known(self) -> str:
        """The era, read first if this process has not read it yet."""
        if self.era is None:
            await self.look()
        assert self.era is not None
        return self.era

    def trusts(self, era: str | None) -> bool:
        """Whether a record written in ``era`` is of the era this process knows.

        A record without one (written before records carried it) is trusted,
        as is any record before this process has read the marker.
        """
        return era is None or self.era is None or era == self.era

    async def seen(self, reply: Any) -> None:
        """Take in a read of the marker (``HMGET id n at``, or a script's same reply)."""
        stored, count, since = _decode(reply)
        self._fresh_until = time.monotonic() + FRESH
        era = self.era
        if era is None:
            if stored is None:  # a store without a marker yet: create it
                await self.seen(await self._command(("EVAL", _LOOK, 1, self.key, _fresh())))
            else:
                self.era, self.count, self.since = stored, count, since
            return
        if stored == era and count >= self.count:
            self.count = count
            return
        async with self._lock:
            if self.era != era:
                return  # taken in meanwhile
            reply = await self._command(
                ("EVAL", _DECLARE, 1, self.key, era, self.count, self.since, _fresh())
            )
            stored, count, since = _decode(reply)
            if stored == era:  # a reply overtaken by a newer one: nothing was lost
                self.count = max(self.count, count)
                return
            self.era, self.count, self.since = stored, count, since
        logger.warning(
            "replaystore: the store went back in time (restored from an older snapshot, or "
            "failed over to a replica that had not received every write): what it holds from "
            "before is no longer trusted; sessions from before are ended with store_regressed, "
            "unfinished tasks from before end failed"
        )
        for react in self._reactions:
            try:
                await react()
            except StorageError as exc:  # the era stands; each record is refused when read
                logger.warning("replaystore: reacting to the store going back failed: %s", exc)

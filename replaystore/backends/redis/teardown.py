"""A failed resume's teardown: by transaction where the wire allows, its condition, its leftovers.

A resume that fails must take its session down for every replica, and only
the incarnation it was judged on, only while its verdict still holds (a
compare-and-delete, under :func:`still_true`'s condition).

When the fast read already decided the verdict (:data:`.fastpath.DECIDED_HERE`)
and the wire sends commands by hand (one server, plain or behind Sentinel),
:func:`tear_down` does it without Lua, in an optimistic transaction on the
meta hash: a command Redis runs as sent costs it less than the same command
called from a script (a few microseconds more each, plus the call itself),
and the reads the condition needs are native commands too.

1. ``WATCH`` the meta hash, and read what the condition needs, every
   sequence's tag (``HKEYS``), the tags of lists left to a sweep (the ``g``
   set) and the tombstone;
2. if the session is the judged incarnation and the condition holds,
   ``MULTI``, delete every key of the session, its lists included, leave the
   tombstone, ``EXEC``; otherwise ``UNWATCH``.

Every change of a session writes its meta hash, so an ``EXEC`` that runs saw
nothing change since the read; one that does not (a concurrent append), or a
condition that no longer holds, sends the resume to ``facts.lua``, which
judges it again. A retry of a call whose reply was lost finds its own
tombstone by the nonce in it. Deleting every list in the transaction's one
``DEL`` costs Redis less than leaving some to a later batch.

Elsewhere (a cluster, a client the wire does not handle) that teardown is
``fail.lua``; after the fast read, and after ``facts.lua`` or ``close.lua``
everywhere, a script deletes the session's fixed keys and the lists it
declared, leaves the tombstone and returns the tags of the session's other
lists. Those are not declared in that call, so it must not touch them;
deleting each session's rest in a call of its own would cost Redis a second
script per failed resume. :class:`Leftovers` collects them and deletes many
sessions' at once, a moment later (``drop.lua``). Nothing reads a torn-down
session's lists, and a session opened again under the same id keeps its own
(``drop.lua`` leaves the lists of a session whose meta hash exists alone); a
process that stops before the batch goes leaves them to expire with the
session's TTL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...cursor import Cursor
from .wire import Wire, pack_args, pack_one

__all__ = ["Leftovers", "still_true", "tear_down", "tombstone_head"]

logger = logging.getLogger("replaystore.redis")

_UNWATCH = (pack_one(("UNWATCH",)), 1)
_MULTI = pack_one(("MULTI",))
_EXEC = pack_one(("EXEC",))
#: What the condition reads of the meta hash (``_holds`` indexes them), packed once.
_WATCHED_FIELDS = pack_args(("epoch", "top", "floor", "nseq"))


def _bulk(text: str) -> bytes:
    """One argument in the Redis protocol."""
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def tombstone_head(code: str, verdict: str) -> str:
    """A failed resume's tombstone JSON, left open: each teardown adds its nonce and time."""
    return json.dumps({"code": code, "verdict": verdict})[:-1]


def still_true(code: str, cursor: Cursor | None, named_tag: str) -> tuple[str, Any]:
    """The condition under which a failed verdict still holds (here, ``fail.lua``, ``close.lua``).

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


def _holds(condition: str, value: Any, meta: list[Any]) -> bool:
    top, floor, nseq = int(meta[1]), int(meta[2]), int(meta[3])
    if condition == "top_below":
        return top < int(value)
    if condition == "no_sequence":
        return meta[4] is None
    if condition == "ambiguous":
        return floor <= 1 and nseq > 1
    if condition == "floor_at_most":
        return floor <= int(value)
    return True


async def tear_down(
    wire: Wire,
    base: str,
    epoch: str,
    condition: tuple[str, Any],
    tombstone: str,
    *,
    ttl_ms: int,
    nonce: str,
) -> bool:
    """Tear the session at key base ``base`` down if it is still ``epoch`` and ``condition`` holds.

    True when it is torn down (by this call, or by its earlier try whose reply
    was lost); False when the session moved or is gone, and the caller judges
    again. Every list of the session goes in the transaction's ``DEL``.
    """
    cond, value = condition
    meta = _bulk(f"{base}:m")
    if cond == "no_sequence":
        hmget = b"*7\r\n$5\r\nHMGET\r\n" + meta + _WATCHED_FIELDS + _bulk(f"s:{value}")
    else:
        hmget = b"*6\r\n$5\r\nHMGET\r\n" + meta + _WATCHED_FIELDS
    # WATCH, HMGET, HKEYS, SMEMBERS, GET: packed from fixed pieces (a
    # session is torn down once, so nothing of it is worth caching).
    reads = b"".join(
        (
            b"*2\r\n$5\r\nWATCH\r\n",
            meta,
            hmget,
            b"*2\r\n$5\r\nHKEYS\r\n",
            meta,
            b"*2\r\n$8\r\nSMEMBERS\r\n",
            _bulk(f"{base}:g"),
            b"*2\r\n$3\r\nGET\r\n",
            _bulk(f"{base}:t"),
        )
    )
    gone: list[bytes | None] = []

    def then(replies: list[Any]) -> tuple[bytes, int]:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        _, found, fields_now, left, tomb = replies
        if found[0] is None:
            gone.append(tomb)
            return _UNWATCH
        if found[0].decode() != epoch or not _holds(cond, value, found):
            return _UNWATCH
        tags = {f[2:] for f in fields_now if f.startswith(b"s:")} | set(left)
        keys = [f"{base}:{name}" for name in ("m", "i", "g", "k", "k2", "x")]
        keys += [f"{base}:q:{tag.decode()}" for tag in sorted(tags)]
        stone = f'{tombstone},"id":"{nonce}","at":{int(time.time() * 1000)}}}'
        packet = b"".join(
            (
                _MULTI,
                b"*%d\r\n$3\r\nDEL\r\n" % (len(keys) + 1),
                pack_args(keys),
                b"*5\r\n$3\r\nSET\r\n",
                pack_args((f"{base}:t", stone, "PX", ttl_ms)),
                _EXEC,
            )
        )
        return packet, 4  # MULTI, DEL, SET, EXEC

    replies = await wire.watched(reads, 5, then)
    if gone:
        return gone[0] is not None and f'"id":"{nonce}"'.encode() in gone[0]
    if len(replies) == 1:
        return False  # UNWATCH: the verdict no longer holds as judged
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies[-1] is not None  # None: the meta hash changed, EXEC ran nothing


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

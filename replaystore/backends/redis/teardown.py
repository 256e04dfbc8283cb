"""A failed resume torn down without a script: ``WATCH``, read, ``MULTI``/``EXEC``.

A resume that fails must take its session down for every replica, and only
the incarnation it was judged on, only while its verdict still holds (a
compare-and-delete). When the fast read already decided the verdict
(:data:`.fastpath.DECIDED_HERE`), the teardown needs no Lua: an optimistic
transaction on the meta hash does it in native commands, which cost Redis a
fraction of a script (a failed reconnect costs several times a good one
through ``facts.lua``, which a reconnect storm full of stale cursors feels).

1. ``WATCH`` the meta hash, and read what the condition needs, every
   sequence's tag (``HKEYS``), the tags of lists left to a sweep (the ``g``
   set) and the tombstone;
2. if the session is the judged incarnation and the condition holds,
   ``MULTI``, delete every key of the session, its lists included, leave the
   tombstone, ``EXEC``; otherwise ``UNWATCH``.

Every change of a session writes its meta hash, so an ``EXEC`` that runs saw
nothing change since the read; one that does not (a concurrent append), or a
condition that no longer holds, sends the resume to ``facts.lua``, which
judges it again. Knowing every tag from ``HKEYS``, the transaction deletes
every list at once: no sweep follows. A retry of a call whose reply was lost
finds its own tombstone by the nonce in it.

The conditions are :func:`still_true`'s, the ones ``close.lua`` checks too.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ...cursor import Cursor
from .wire import Wire, pack_one

__all__ = ["still_true", "tear_down"]

_UNWATCH = (pack_one(("UNWATCH",)), 1)


def still_true(code: str, cursor: Cursor | None, named_tag: str) -> tuple[str, Any]:
    """The condition under which a failed verdict still holds (here and in ``close.lua``).

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
    tombstone: dict[str, str],
    *,
    ttl_ms: int,
    nonce: str,
) -> bool:
    """Tear the session at key base ``base`` down if it is still ``epoch`` and ``condition`` holds.

    True when it is torn down (by this call, or by its earlier try whose reply
    was lost); False when the session moved or is gone, and the caller judges
    again.
    """
    meta, cond, value = f"{base}:m", condition[0], condition[1]
    fields = ["epoch", "top", "floor", "nseq"]
    if cond == "no_sequence":
        fields.append(f"s:{value}")
    reads = b"".join(
        pack_one(command)
        for command in (
            ("WATCH", meta),
            ("HMGET", meta, *fields),
            ("HKEYS", meta),
            ("SMEMBERS", f"{base}:g"),
            ("GET", f"{base}:t"),
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
        stone = json.dumps(tombstone)[:-1] + f',"id":"{nonce}","at":{int(time.time() * 1000)}}}'
        commands = (
            ("MULTI",),
            ("DEL", *keys),
            ("SET", f"{base}:t", stone, "PX", ttl_ms),
            ("EXEC",),
        )
        return b"".join(pack_one(c) for c in commands), len(commands)

    replies = await wire.watched(reads, 5, then)
    if gone:
        return gone[0] is not None and f'"id":"{nonce}"'.encode() in gone[0]
    if len(replies) == 1:
        return False  # UNWATCH: the verdict no longer holds as judged
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies[-1] is not None  # None: the meta hash changed, EXEC ran nothing

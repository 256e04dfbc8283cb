"""A task's events read without Lua: one pipeline of native commands, judged here.

A script that returns list elements costs Redis several times what the
native ``LRANGE`` of the same elements costs, and a task's stream reads its
events on every resume and every wake-up. So a read is one round trip of
native commands: an ``HMGET`` of the task hash fields a read depends on
(status, lease, owner, the next ``seq``, the retention), the event list's
length (so its floor), its oldest element (its time says whether age
retention is due), an ``LRANGE`` of the events asked for, and then the next
``seq`` and the length once more. Everything is decoded here, and the caller
judges the cursor on the page as after the script.

No ``MULTI`` is needed for a snapshot: the list changes only by appends
(each one moves the next ``seq`` up) and by drops from its head or the whole
list (each one shortens it while the next ``seq`` stays), so a next ``seq``
and a length read the same after the ``LRANGE`` as before mean the list did
not change between the first command and the last: the page is the task as
the ``HMGET`` saw it. A read that sees them differ is sent again.

The ``LRANGE`` is sent before the floor is known: its range is taken from
the floor this process last saw for the task (0 for a task it has not seen;
the floor moves only when retention drops events). The events are kept only
if the read shows that floor, or the range asked for is past the end of the
list either way; otherwise the read is sent again from the floor just seen.
After three reads in doubt, the script reads.

``events.lua`` still reads whenever the read shows that it would write: a
lease that has lapsed (or is within :data:`CLOCK_MARGIN_MS` of it by this
process's clock; the script judges it, and may end the task), or retention
due (more events than kept, the oldest older than the age kept). Those rules
live in the scripts only; this module only tells when none of them can act.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import Enum
from typing import Any, Final

from ....taskstore.events import EventPage, decode_event
from ....taskstore.records import TERMINAL
from ..errors import mapped
from ..scripts import CLOCK_MARGIN_MS

__all__ = ["SCRIPT", "EventReads"]


class _Script(Enum):
    SCRIPT = "script"


#: What :meth:`EventReads.read` returns when the script must read (it would write).
SCRIPT: Final = _Script.SCRIPT

#: The task hash fields a read needs (see ``_lib.lua``): status, lease end,
#: owner, the next seq, events kept, ms an event is kept.
_FIELDS: Final = ("st", "ls", "own", "evn", "evc", "eva")
_KEEP_DEFAULT: Final = 1000  # as ``trim_events`` reads a hash without ``evc``
#: Past the end of any list (one holds at most a million events), and an index Redis
#: takes: a cursor far beyond the last ``seq`` asks for an empty range, not a refusal.
_FAR: Final = 1 << 40


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class EventReads:
    """The task event reads of one store, and the floor it last saw per task."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._floors: dict[str, int] = {}

    async def read(
        self, task_id: str, keys: Sequence[str], owner: str, start: int | None, limit: int
    ) -> EventPage | _Script | None:
        """The page ``events.lua`` would return, or None as it would; :data:`SCRIPT` when the
        script must read (it would write, or the list kept changing under the reads)."""
        hash_key, list_key = keys[0], keys[3]
        for _ in range(3):
            guess = self._floors.get(task_id, 0)
            sent = 0 if start is None else min(max(0, start - guess), _FAR)
            replies = await self._pipeline(hash_key, list_key, sent, limit)
            (status, lease, own, next_seq, keep, age), length, head, *rest = replies
            events, (next_after, length_after) = (rest[0], rest[1:]) if limit > 0 else ([], rest)
            if status is None:
                self._floors.pop(task_id, None)
                return None  # unknown or expired: the script writes nothing either
            if (next_seq, length) != (next_after, length_after):
                continue  # the list changed during the read
            status = _text(status)
            length = int(length)
            now = time.time() * 1000 + CLOCK_MARGIN_MS
            if status not in TERMINAL and (lease is None or int(lease) <= now):
                return SCRIPT  # a lapse to judge
            if own is not None and _text(own) != owner:
                return None
            max_age = int(age or 0)
            if length > int(keep or _KEEP_DEFAULT) or (
                max_age and head is not None and int(head.split(b":", 1)[0]) <= now - max_age
            ):
                return SCRIPT  # retention due
            nxt = int(next_seq or 0)
            floor = nxt - length
            if floor < 0:
                return SCRIPT
            if len(self._floors) > 10_000:
                self._floors.clear()
            self._floors[task_id] = floor
            first = floor if start is None else max(start, floor)
            if first >= nxt or limit <= 0:
                return EventPage(floor, nxt, status, [])
            if first - floor != sent:
                continue  # the range was taken from another floor: again from this one
            decoded = [decode_event(first + i, entry) for i, entry in enumerate(events)]
            return EventPage(floor, nxt, status, decoded)
        return SCRIPT

    async def _pipeline(self, hash_key: str, list_key: str, sent: int, limit: int) -> list[Any]:
        """The commands of one read, in one round trip (the task's keys share a slot)."""
        with mapped("task events", self._client):
            pipe = self._client.pipeline(transaction=False)
            pipe.execute_command("HMGET", hash_key, *_FIELDS)
            pipe.execute_command("LLEN", list_key)
            pipe.execute_command("LINDEX", list_key, 0)
            if limit > 0:
                pipe.execute_command("LRANGE", list_key, sent, sent + min(limit, _FAR) - 1)
            pipe.execute_command("HGET", hash_key, "evn")
            pipe.execute_command("LLEN", list_key)
            replies: list[Any] = await pipe.execute()
        return replies

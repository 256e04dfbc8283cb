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

1. ``WATCH`` the meta hash, and read it whole (``HGETALL``: the condition's
   fields and every sequence's tag in one command) and the tags of lists left
   to a sweep (the ``g`` set);
2. if the session is the judged incarnation and the condition holds,
   ``MULTI``, delete every key of the session, its lists included, leave the
   tombstone, ``EXEC``; otherwise ``UNWATCH``. A session found gone gets its
   tombstone read in that packet: a retry of a call whose reply was lost
   finds its own teardown by the nonce in it.

Failures that come together share one transaction (:class:`Teardowns`, a
group commit), so a storm of them costs Redis two round trips per batch
rather than per session.

Every change of a session writes its meta hash, so an ``EXEC`` that runs saw
nothing change since the read; one that does not (a concurrent append), or a
condition that no longer holds, sends the resume to ``facts.lua``, which
judges it again (after a transaction of its own, if its batch had others).
Deleting every list in the transaction's one ``DEL`` costs Redis less than
leaving some to a later batch.

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...cursor import Cursor
from ...errors import StorageError
from .keys import meta as meta_key
from .keys import swept, teardown_keys
from .keys import tombstone as tombstone_key
from .wire import Transactions, pack_args, pack_one

__all__ = [
    "Leftovers",
    "Teardown",
    "Teardowns",
    "still_holds",
    "still_true",
    "tear_down",
    "tombstone_head",
]

logger = logging.getLogger("replaystore.redis")

_UNWATCH = (pack_one(("UNWATCH",)), 1)
_MULTI = pack_one(("MULTI",))
_EXEC = pack_one(("EXEC",))


def _bulk(text: str) -> bytes:
    """One argument in the Redis protocol."""
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def tombstone_head(code: str, verdict: str) -> str:
    """A failed resume's tombstone JSON, left open: each teardown adds its nonce and time."""
    return json.dumps({"code": code, "verdict": verdict})[:-1]


def still_true(code: str, cursor: Cursor | None, named_tag: str) -> tuple[str, Any]:
    """The condition under which a failed verdict still holds (:func:`still_holds` checks it).

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


def still_holds(meta: Mapping[bytes, bytes], epoch: str, condition: str, value: Any) -> bool:
    """Whether a failed verdict still holds on the session's meta hash, so it may be torn down.

    The session must still be the incarnation ``epoch`` the verdict was
    decided on (``""`` for any) and ``condition`` (:func:`still_true`) must
    still hold for ``value``. ``_lib.lua``'s ``still_holds`` is the same rule
    for the scripts; one table of cases holds both.
    """
    if epoch and meta.get(b"epoch", b"").decode() != epoch:
        return False
    if condition == "top_below":
        return int(meta[b"top"]) < int(value)
    if condition == "no_sequence":
        return f"s:{value}".encode() not in meta
    if condition == "ambiguous":
        return int(meta[b"floor"]) <= 1 and int(meta[b"nseq"]) > 1
    if condition == "floor_at_most":
        return int(meta[b"floor"]) <= int(value)
    return True


@dataclass(frozen=True, slots=True)
class Teardown:
    """One failed resume's teardown: the session at key base ``base``, if still ``epoch``.

    Only while ``condition`` (:func:`still_true`) holds; ``tombstone`` is the
    stone's JSON head (:func:`tombstone_head`), ``nonce`` names this call in it.
    """

    base: str
    epoch: str
    condition: tuple[str, Any]
    tombstone: str
    ttl_ms: int
    nonce: str

    def reads(self) -> bytes:
        """``HGETALL`` of the meta hash (the condition's fields and every sequence tag), and
        ``SMEMBERS`` of the ``g`` set (the tags of lists left to a sweep)."""
        return b"".join(
            (
                b"*2\r\n$7\r\nHGETALL\r\n",
                _bulk(meta_key(self.base)),
                b"*2\r\n$8\r\nSMEMBERS\r\n",
                _bulk(swept(self.base)),
            )
        )


async def tear_down(wire: Transactions, requests: Sequence[Teardown]) -> list[bool]:
    """Tear each session down if it is still the judged incarnation and its condition holds.

    One optimistic transaction for them all: ``WATCH`` on every meta hash
    with the reads, then one ``MULTI`` ... ``EXEC`` deleting every key of
    the sessions to go (their lists included, in one ``DEL``) and leaving
    their tombstones. Per request: True when it is torn down (by this call,
    or by its earlier try whose reply was lost); False when the session
    moved or is gone, and the caller judges again. When the ``EXEC`` ran
    nothing (a watched session changed meanwhile) each is tried again alone,
    so that one busy session does not send the others back to be judged.
    """
    metas = [meta_key(r.base) for r in requests]
    reads = b"".join(
        (
            b"*%d\r\n$5\r\nWATCH\r\n" % (len(metas) + 1),
            pack_args(metas),
            *(r.reads() for r in requests),
        )
    )
    outcome: list[bool] = [False] * len(requests)
    going: list[int] = []
    gone: list[int] = []

    def then(replies: list[Any]) -> tuple[bytes, int]:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        keys: list[str] = []
        stones: list[bytes] = []
        now = int(time.time() * 1000)
        for i, r in enumerate(requests):
            flat, left = replies[1 + 2 * i], replies[2 + 2 * i]
            if not flat:
                gone.append(i)  # torn down meanwhile: by our earlier try, if its stone says so
                continue
            # a map under RESP3, a flat list of fields and values under RESP2
            meta = flat if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=True))
            if not still_holds(meta, r.epoch, *r.condition):
                continue
            going.append(i)
            tags = {f[2:] for f in meta if f.startswith(b"s:")} | set(left)
            keys += teardown_keys(r.base, [tag.decode() for tag in sorted(tags)])
            stone = f'{r.tombstone},"id":"{r.nonce}","at":{now}}}'
            stones.append(
                b"*5\r\n$3\r\nSET\r\n" + pack_args((tombstone_key(r.base), stone, "PX", r.ttl_ms))
            )
        # The gone sessions' tombstones are read first, outside the transaction.
        tombs = b"".join(
            b"*2\r\n$3\r\nGET\r\n" + _bulk(tombstone_key(requests[i].base)) for i in gone
        )
        if not going:
            return tombs + _UNWATCH[0], len(gone) + 1
        packet = b"".join(
            (
                tombs,
                _MULTI,
                b"*%d\r\n$3\r\nDEL\r\n" % (len(keys) + 1),
                pack_args(keys),
                *stones,
                _EXEC,
            )
        )
        return packet, len(gone) + 3 + len(stones)  # GETs, MULTI, DEL, the SETs, EXEC

    replies = await wire.watched(reads, 1 + 2 * len(requests), then)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    for i, tomb in zip(gone, replies, strict=False):
        outcome[i] = tomb is not None and f'"id":"{requests[i].nonce}"'.encode() in tomb
    if not going:
        return outcome
    if replies[-1] is not None:
        for i in going:
            outcome[i] = True
    elif len(requests) > 1:
        for i in going:  # None: a watched session changed, the EXEC ran nothing
            (outcome[i],) = await tear_down(wire, [requests[i]])
    return outcome


class Teardowns:
    """Failed resumes' teardowns, the ones waiting together in one transaction.

    While a transaction is under way the next requests wait, and then go
    together (a group commit): a reconnect storm's failures cost a round trip
    pair per batch rather than per session, and a lone failure goes at once.
    At most ``size`` sessions per transaction.
    """

    def __init__(self, wire: Transactions, *, size: int = 64) -> None:
        self._wire = wire
        self.size = size
        self._queue: list[tuple[Teardown, asyncio.Future[bool]]] = []
        self._task: asyncio.Task[None] | None = None

    def submit(self, request: Teardown) -> asyncio.Future[bool]:
        """Queue ``request``; the future is :func:`tear_down`'s answer for it (or its error)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        if self._task is not None and self._task.get_loop() is not loop:
            # a backend used from another event loop than the last one's: what
            # waited there can never be answered (that loop is gone or idle)
            self._task, self._queue = None, []
        self._queue.append((request, future))
        if self._task is None:
            self._task = loop.create_task(self._run())
        return future

    async def _run(self) -> None:
        batch: list[tuple[Teardown, asyncio.Future[bool]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue[: self.size], self._queue[self.size :]
                # The outcome as a value, an error included: each caller maps or retries it.
                [torn] = await asyncio.gather(
                    tear_down(self._wire, [request for request, _ in batch]),
                    return_exceptions=True,
                )
                for at, (_, future) in enumerate(batch):
                    if future.done():  # a caller that gave up cancelled its own
                        continue
                    if isinstance(torn, Exception):
                        future.set_exception(torn)
                    elif isinstance(torn, BaseException):
                        future.cancel()
                    else:
                        future.set_result(torn[at])
        finally:
            self._task = None
            for _, future in (*batch, *self._queue):  # only if this task itself was cancelled
                if not future.done():
                    future.cancel()
            self._queue = []

    async def aclose(self) -> None:
        """Wait for the transactions under way (on this event loop)."""
        task = self._task
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            await asyncio.gather(task, return_exceptions=True)


#: Sends ``drop.lua`` with these keys and arguments.
Drop = Callable[[list[str], list[Any]], Awaitable[Any]]


class Leftovers:
    """Lists of torn-down sessions, deleted in batches: after ``delay`` seconds or ``size`` keys.

    The delay is what lets failures share a call: those of a reconnect storm
    come a few milliseconds apart and go in a handful of calls, not one
    each; nothing reads the lists meanwhile, they only hold memory a moment
    longer.

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
        delay: float = 0.25,
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
        task.add_done_callback(self._finished)

    async def _flush_logged(self) -> None:
        try:
            await self.flush()
        except StorageError as exc:  # the lists expire with their session anyway
            logger.warning("leftover lists of torn-down sessions not deleted: %s", exc)

    def _finished(self, task: asyncio.Task[None]) -> None:
        """Forget a batch sent; any error but the store's is a bug, logged with its traceback
        (nobody awaits the task for it: :meth:`aclose` only waits for it to end)."""
        self._running.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("deleting leftover lists of torn-down sessions failed", exc_info=error)

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

"""Tasks on Redis (standalone, Sentinel, Cluster) or Valkey: one Lua script per operation.

A task is four keys sharing one hash tag, so on a cluster they live in one
slot and every script declares all of them: the task hash (status, times,
runner lease, owner, packed result or error, the next event ``seq`` and the
events' retention), its outstanding input requests, the answers the runner
has not taken yet, and its retained events (a list, oldest first; an append
is announced by a ``PUBLISH`` on the list's own name). Times come from the server's
clock (``TIME`` inside the script), so replicas with skewed clocks agree on
leases and ``lastUpdatedAt``. Every key expires with the task's TTL: after it,
the store holds nothing of the task.

The scripts live in ``lua/`` beside this module; ``_lib.lua`` is prepended to
each, as the session scripts do.

Every key of a store made with a namespace (the app whose tasks these are)
carries it (``<prefix>{task:<namespace>:<id>}``, ``<prefix>{tasks:<namespace>}``),
so apps sharing one Redis and prefix never see each other's tasks.

Beside the tasks, one sorted set (``<prefix>{tasks}:running``, a slot of its
own on a cluster) lists the tasks that may be running, each with the time its
lease may have lapsed: what :meth:`RedisTaskStore.reap` looks at. It is a hint
only, never a second copy of the truth: a create adds the task to it in the
same round trip, an end removes it, and a scan checks each due task with the
same atomic lapse rule a reader applies (in the task's own slot), then
corrects or drops the entry. A stale, missing or duplicated entry therefore
costs one check or delays a background end; it can never end a task wrongly.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from importlib import resources
from typing import Any

import anyio
from redis.exceptions import ResponseError

from ....errors import StorageError
from ....taskstore.events import EventPage, EventRetention, decode_event
from ....taskstore.records import (
    LOST_ERROR,
    OUTAGE_ERROR,
    RESTORED_ERROR,
    TERMINAL,
    Beat,
    NotReplicatedError,
    Reaped,
    TaskRecord,
    pack,
    unpack,
)
from ....taskstore.store import TaskStore
from ...notifications import hint
from ..errors import STORE_ERRORS, mapped, storage_error
from ..keys import task_event_channels, task_index, task_keys, task_nudges
from ..marker import StoreMarker
from .eventread import SCRIPT, EventReads
from .wakeups import EventWakeups

__all__ = ["RedisTaskStore"]

logger = logging.getLogger(__name__)

#: What one task's reply in a batch may fail with: the store's error for that
#: command, or a record that does not decode (msgpack's errors are ValueErrors).
_DAMAGED: tuple[type[BaseException], ...] = (*STORE_ERRORS, ValueError, IndexError)


def _source(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


_LIB = _source("_lib")
_SCRIPTS = {
    name: _LIB + _source(name)
    for name in (
        "create",
        "get",
        "ask",
        "respond",
        "cancel",
        "finish",
        "beat",
        "claim",
        "reap",
        "emit",
        "events",
    )
}
_SCRIPTS["sweep"] = _source("sweep")  # the index alone: no task keys
_SHAS = {name: hashlib.sha1(text.encode()).hexdigest() for name, text in _SCRIPTS.items()}


@dataclass(frozen=True, slots=True)
class _Step:
    """One command of a pipeline: a script by name (``keys``, ``args``), or a plain command."""

    script: str | None
    keys: Sequence[str] = ()
    args: Sequence[Any] = ()


def _noscript(reply: Any) -> bool:
    text = str(reply)
    return isinstance(reply, Exception) and ("NOSCRIPT" in text or "No matching script" in text)


async def _subscribe(pubsub: Any, channel: str) -> None:
    """Subscribe and wait for the server's confirmation.

    Only once the server has confirmed is a later ``PUBLISH`` sure to reach
    this connection; without the wait, a change made just after
    :meth:`RedisTaskStore.nudges` is entered could go unheard.
    """
    await pubsub.subscribe(channel)
    while True:
        raw = await pubsub.get_message(ignore_subscribe_messages=False, timeout=1.0)
        if raw is not None and raw.get("type") == "subscribe":
            return


async def _listen(
    pubsub: Any, channel: str, nudge: Callable[[str], None], *, subscribed: bool
) -> None:
    """Hand each task id published on ``channel`` to ``nudge``; resubscribe after a failure."""
    while True:
        try:
            if not subscribed:
                await _subscribe(pubsub, channel)
                subscribed = True
            raw = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        except STORE_ERRORS as exc:
            logger.debug("runner nudges interrupted (%s); reconnecting", exc)
            subscribed = False
            await anyio.sleep(0.5)
            continue
        if raw is None or raw.get("type") != "message":
            continue
        data = raw.get("data")
        task_id = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        # A hint: the next beat reads the change anyway.
        hint(nudge, task_id, about=f"nudging the runner of task {task_id}")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _pairs(flat: Sequence[Any]) -> dict[str, Any]:
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}


def _record(
    task_id: str, fields: dict[str, Any], outstanding: dict[str, Any], rerun: bool = False
) -> TaskRecord:
    status = _text(fields["st"])
    message = _text(fields["msg"]) if "msg" in fields else None
    error = unpack(fields["err"]) if "err" in fields else None
    if "lost" in fields:
        error = dict(OUTAGE_ERROR if _text(fields["lost"]) == "2" else LOST_ERROR)
        message = error["message"]
    return TaskRecord(
        task_id=task_id,
        status=status,
        created_ms=int(fields["c"]),
        updated_ms=int(fields["u"]),
        ttl_ms=int(fields["ttl"]),
        poll_ms=int(fields["pi"]) if "pi" in fields else None,
        message=message,
        result=unpack(fields["res"]) if "res" in fields else None,
        error=error,
        input_requests={key: unpack(blob) for key, blob in outstanding.items()},
        rerun=rerun,
    )


class RedisTaskStore(TaskStore):
    """Task records in the Redis a backend declares through its coordination.

    With ``wait_replicas``, each write that changes a task's status is sent
    with ``WAIT`` on the same connection, in one round trip, and counts only
    once that many Redis replicas acknowledged it (within ``wait_timeout``):

    - the create: otherwise ``StorageError``, and the client gets no task;
    - a client's change (``respond``, ``cancel``): otherwise
      :class:`~replaystore.taskstore.records.NotReplicatedError`; the change stands on the primary
      and is safe to repeat;
    - the runner's changes (``ask``, ``finish``, ``claim``): a warning is
      logged; the change stands on the primary (the runner has no one to tell,
      and refusing would only turn a stored result into a lost one).

    Lease renewals are not waited for: they change no status, and a failover
    that loses one only lets the lease lapse sooner.
    """

    def __init__(
        self,
        client: Any,
        key_base: Callable[[str], str],
        *,
        namespace: str = "",
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        marker: StoreMarker | None = None,
    ) -> None:
        self._client = client
        self._key_base = key_base
        self._space = _space(namespace)
        self._wait_replicas = wait_replicas
        self._wait_timeout = wait_timeout
        self._marker = marker
        pattern, head, tail = task_event_channels(key_base, self._space)
        self._wakeups = EventWakeups(client, pattern, head, tail)
        self._reads = EventReads(client)

    def keys(self, task_id: str) -> list[str]:
        """The task's keys, hash tag included (the backend's rule, so ids with braces are safe).

        Behind the namespace: a task of another namespace (another app on the
        same Redis and prefix) has other keys, so no operation here can read,
        claim or end it.
        """
        return task_keys(self._key_base, self._space, task_id)

    async def _run(self, name: str, task_id: str, *args: Any) -> Any:
        """One script, by digest; sent whole only when the server does not have it yet."""
        keys = self.keys(task_id)
        with mapped(f"task {name}", self._client):
            try:
                return await self._client.evalsha(_SHAS[name], len(keys), *keys, *args)
            except ResponseError as exc:
                if not _noscript(exc):
                    raise
                return await self._client.eval(_SCRIPTS[name], len(keys), *keys, *args)

    def _nudge_prefix(self) -> str:
        """The pub/sub channels of the runners, ``<prefix><runner>`` (see :meth:`nudges`)."""
        return task_nudges(self._key_base, self._space)

    @asynccontextmanager
    async def nudges(self, runner: str, nudge: Callable[[str], None]) -> AsyncIterator[None]:
        """Classic pub/sub on one connection: the scripts ``PUBLISH`` to the runner's channel.

        On a cluster a ``PUBLISH`` reaches subscribers on every node. The
        connection reconnects by itself; what was published while it was down
        is lost, which only delays the runner to its next beat.
        """
        channel = self._nudge_prefix() + runner
        pubsub = self._client.pubsub()
        try:
            subscribed = False
            with anyio.move_on_after(5.0):
                try:
                    await _subscribe(pubsub, channel)
                    subscribed = True
                except STORE_ERRORS as exc:  # the listener keeps trying; beats still come
                    logger.warning("subscribing to runner nudges failed (%s); retrying", exc)
            async with anyio.create_task_group() as group:
                group.start_soon(partial(_listen, subscribed=subscribed), pubsub, channel, nudge)
                try:
                    yield
                finally:
                    group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                try:
                    await pubsub.aclose()
                except STORE_ERRORS:
                    logger.debug("closing the nudge connection failed", exc_info=True)

    def _index(self) -> str:
        """The sorted set of tasks that may be running (its own hash tag)."""
        return task_index(self._key_base, self._space)

    async def _pipeline(self, steps: Sequence[_Step], *, whole: bool = False) -> list[Any]:
        """``steps`` in one round trip; the replies in order (a failed command's: its error)."""
        with mapped("task store pipeline", self._client):
            pipe = self._client.pipeline(transaction=False)
            for step in steps:
                if step.script is None:
                    pipe.execute_command(*step.args)
                else:
                    # By name: redis-py's cluster pipeline refuses its evalsha() method,
                    # while the command itself is routed by its keys like any other.
                    script = (
                        ("EVAL", _SCRIPTS[step.script])
                        if whole
                        else ("EVALSHA", _SHAS[step.script])
                    )
                    pipe.execute_command(*script, len(step.keys), *step.keys, *step.args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    async def _send(self, steps: Sequence[_Step]) -> list[Any]:
        """``steps`` in one round trip, scripts by digest.

        A script the server does not know (a restart, ``SCRIPT FLUSH``) did
        not run: it is sent again whole, with the plain commands that followed
        it (an index update, ``WAIT``); nothing that ran is run twice.
        """
        replies = await self._pipeline(steps)
        missing = [
            i
            for i, (s, r) in enumerate(zip(steps, replies, strict=True))
            if s.script and _noscript(r)
        ]
        if missing:
            again = [
                i for i in range(missing[0], len(steps)) if i in missing or steps[i].script is None
            ]
            redone = await self._pipeline([steps[i] for i in again], whole=True)
            for i, reply in zip(again, redone, strict=True):
                replies[i] = reply
        return replies

    async def _change(
        self,
        name: str,
        task_id: str,
        *args: Any,
        client: bool = False,
        before: Sequence[Any] = (),
        after: Sequence[Any] = (),
    ) -> Any:
        """A status-changing script, waited for by ``wait_replicas`` replicas if set.

        ``before``, ``after``: a plain command sent in the same round trip
        (the index of running tasks). ``client``: the change was asked by a
        client, who is told (by :class:`NotReplicatedError`) when too few
        replicas acknowledged it.
        """
        if not self._wait_replicas and not before and not after:
            return await self._run(name, task_id, *args)
        steps = [_Step(None, args=before)] if before else []
        steps.append(_Step(name, self.keys(task_id), args))
        if after:
            steps.append(_Step(None, args=after))
        if self._wait_replicas:
            timeout_ms = max(1, int(self._wait_timeout * 1000))
            steps.append(_Step(None, args=("WAIT", self._wait_replicas, timeout_ms)))
        replies = await self._send(steps)
        for step, reply in zip(steps, replies, strict=True):
            if isinstance(reply, Exception):
                what = step.script or step.args[0]
                raise storage_error(f"task {name} ({what})", reply, self._client)
        reply = replies[1 if before else 0]
        if not self._wait_replicas:
            return reply
        acked = int(replies[-1])
        if acked < self._wait_replicas:
            text = (
                f"task {name} stored on the primary but acknowledged by {acked} of "
                f"{self._wait_replicas} replica(s) within {self._wait_timeout} s"
            )
            if name == "create":
                raise StorageError(text)
            if client:
                raise NotReplicatedError(text)
            logger.warning("task %s: %s", task_id, text)
        return reply

    async def create(
        self,
        task_id: str,
        *,
        runner: str,
        lease: float,
        ttl_ms: int,
        poll_ms: int | None = None,
        owner: str | None = None,
        attempts: int = 1,
        call: Mapping[str, Any] | None = None,
        events: EventRetention | None = None,
    ) -> TaskRecord:
        poll = "" if poll_ms is None else str(poll_ms)
        kept = events if events is not None else EventRetention()
        call_blob = pack(call) if call is not None else b""
        tool = call.get("name") if call is not None else None
        args = (
            runner,
            int(lease * 1000),
            ttl_ms,
            poll,
            owner or "",
            max(1, attempts),
            call_blob,
            tool if isinstance(tool, str) else "",  # plain, for claim to compare
            kept.max_events,
            kept.age_ms,
            kept.terminal_ms,
        )
        # The index entry first: a task is never running without one. Its time,
        # 0, makes the next scan look at it and file it under its real lease.
        index = ("ZADD", self._index(), 0, task_id)
        created = await self._change("create", task_id, *args, before=index)
        if created is None:
            raise ValueError(f"task id {task_id!r} is taken")
        now = int(created)
        return TaskRecord(task_id, "working", now, now, ttl_ms, poll_ms)

    async def _seen(self, steps: Sequence[_Step]) -> list[Any]:
        """``steps``' replies, the store's marker read first in the same round trip and taken in
        (:mod:`..marker`); ``steps`` alone without a marker, or one read a moment ago."""
        marker = self._marker
        if marker is None or not marker.due():
            return await self._send(steps)
        seen, *replies = await self._send([_Step(None, args=marker.read), *steps])
        with mapped("reading the store's marker", self._client):
            if isinstance(seen, Exception):
                raise seen
            await marker.seen(seen)
        return replies

    def _untrusted(self, created_ms: int, status: str) -> bool:
        """An unfinished task created before the store last went back: its record may be
        older than what its client saw (a status it reported ended, say)."""
        marker = self._marker
        return marker is not None and created_ms < marker.since and status not in TERMINAL

    async def _end_restored(self, task_id: str) -> None:
        """End a task of :meth:`_untrusted` ``failed``: never run again, never read unfinished."""
        message = RESTORED_ERROR["message"]
        logger.warning("task %s: %s", task_id, message)
        await self.finish(task_id, "failed", error=RESTORED_ERROR, message=message)

    async def get(self, task_id: str, *, owner: str | None = None) -> TaskRecord | None:
        if self._marker is not None and self._marker.due():
            [reply] = await self._seen([_Step("get", self.keys(task_id), (owner or "",))])
            if isinstance(reply, Exception):
                raise storage_error("task get", reply, self._client)
        else:
            reply = await self._run("get", task_id, owner or "")
        if not reply:
            return None
        rerun = len(reply) > 2 and int(reply[2]) == 1
        record = _record(task_id, _pairs(reply[0]), _pairs(reply[1]), rerun)
        if not self._untrusted(record.created_ms, record.status):
            return record
        await self._end_restored(task_id)
        return await self.get(task_id, owner=owner)

    async def ask(
        self, task_id: str, runner: str, requests: Sequence[Mapping[str, Any]]
    ) -> list[str] | None:
        blobs = [pack(request) for request in requests]
        reply = await self._change("ask", task_id, runner, *blobs)
        return None if reply is None else [_text(key) for key in reply]

    async def respond(
        self, task_id: str, answers: Mapping[str, Mapping[str, Any]], *, owner: str | None = None
    ) -> bool:
        args: list[Any] = []
        for key, answer in answers.items():
            args += [key, pack(answer)]
        return bool(
            await self._change(
                "respond", task_id, owner or "", self._nudge_prefix(), task_id, *args, client=True
            )
        )

    async def cancel(
        self, task_id: str, *, owner: str | None = None, message: str | None = None
    ) -> bool:
        flag = "" if message is None else "1"
        reply = await self._change(
            "cancel",
            task_id,
            owner or "",
            flag,
            message or "",
            self._nudge_prefix(),
            task_id,
            client=True,
            after=("ZREM", self._index(), task_id),
        )
        if reply:
            await self._counted(task_id)
        return bool(reply)

    async def _counted(self, task_id: str) -> None:
        """A task ended: a lasting fact, counted in the store's marker (:mod:`..marker`)."""
        if self._marker is None:
            return
        try:
            with mapped("counting an ended task", self._client):
                await self._marker.counted()
        except StorageError as exc:  # the task ended; only the count is missing
            logger.warning("the end of task %s was not counted: %s", task_id, exc)

    async def finish(
        self,
        task_id: str,
        status: str,
        *,
        result: Mapping[str, Any] | None = None,
        error: Mapping[str, Any] | None = None,
        message: str | None = None,
        runner: str | None = None,
    ) -> bool:
        if status not in ("completed", "failed", "cancelled"):
            raise ValueError(f"not a terminal status: {status!r}")
        field, blob = "", b""
        if result is not None:
            field, blob = "res", pack(result)
        elif error is not None:
            field, blob = "err", pack(error)
        flag = "" if message is None else "1"
        ended = await self._change(
            "finish",
            task_id,
            status,
            field,
            blob,
            flag,
            message or "",
            runner or "",
            after=("ZREM", self._index(), task_id),
        )
        if ended:
            await self._counted(task_id)
        return bool(ended)

    async def emit(self, task_id: str, runner: str, blob: bytes, *, key: str = "") -> int | None:
        reply = await self._run("emit", task_id, runner, blob, key)
        return None if reply is None else int(reply)

    async def events(
        self, task_id: str, *, owner: str | None = None, start: int | None = None, limit: int = 100
    ) -> EventPage | None:
        start = None if start is None else max(0, start)
        fast = await self._reads.read(task_id, self.keys(task_id), owner or "", start, limit)
        if fast is not SCRIPT:
            return fast
        first = "" if start is None else str(start)
        reply = await self._run("events", task_id, owner or "", first, max(0, limit))
        if not reply:
            return None
        status, next_seq, kept, entries, rerun = reply
        next_seq, floor = int(next_seq), int(next_seq) - int(kept)
        begin = floor if start is None else max(start, floor)
        decoded = [decode_event(begin + i, entry) for i, entry in enumerate(entries)]
        return EventPage(floor, next_seq, _text(status), decoded, int(rerun) == 1)

    @asynccontextmanager
    async def event_wakeups(self, task_id: str, wake: Callable[[], None]) -> AsyncIterator[None]:
        async with self._wakeups.watch(task_id, wake):
            yield

    async def beat(self, task_id: str, runner: str, lease: float) -> Beat | None:
        reply = await self._run("beat", task_id, runner, int(lease * 1000))
        if not reply:
            return None
        answers = {key: unpack(blob) for key, blob in _pairs(reply[1]).items()}
        return Beat(_text(reply[0]), answers)

    async def beat_many(
        self, task_ids: Sequence[str], runner: str, lease: float
    ) -> list[Beat | None]:
        if not task_ids:
            return []
        ms = int(lease * 1000)
        steps = [_Step("beat", self.keys(task_id), (runner, ms)) for task_id in task_ids]
        beats: list[Beat | None] = []
        for task_id, reply in zip(task_ids, await self._send(steps), strict=True):
            try:
                if isinstance(reply, Exception):
                    raise reply
                if not reply:
                    beats.append(None)
                    continue
                answers = {key: unpack(blob) for key, blob in _pairs(reply[1]).items()}
                beats.append(Beat(_text(reply[0]), answers))
            except _DAMAGED as exc:  # one damaged record must not stop the others
                logger.warning("task %s: lease renewal failed: %s", task_id, exc)
                beats.append(None)
        return beats

    async def _sweep(self, corrections: Sequence[tuple[str, str]], limit: int, hide: float) -> Any:
        """The index script: apply ``corrections`` (task id, time or ''), take up to ``limit``."""
        args: list[Any] = [limit, max(1, int(hide * 1000)), len(corrections)]
        for task_id, at in corrections:
            args += [at, task_id]
        [reply] = await self._send([_Step("sweep", [self._index()], args)])
        if isinstance(reply, Exception):
            raise storage_error("task scan", reply, self._client)
        return reply

    async def reap(self, *, limit: int = 100, hide: float = 5.0) -> Reaped:
        now, first, taken = await self._sweep((), limit, hide)
        due = [_text(task_id) for task_id in taken]
        if not due:
            return Reaped(next_in=None if first is None else max(0.0, (float(first) - now) / 1000))
        steps = [_Step("reap", self.keys(task_id), ()) for task_id in due]
        replies = await self._send(steps)
        failed, orphaned, corrections = [], [], []
        for task_id, reply in zip(due, replies, strict=True):
            if isinstance(reply, Exception):  # left hidden: checked again after ``hide``
                logger.warning("task %s: lease check failed: %s", task_id, reply)
                continue
            if not reply or _text(reply[0]) in TERMINAL:
                corrections.append((task_id, ""))
                if reply and int(reply[3]) == 1:
                    failed.append(task_id)
            elif int(reply[2]) == 1:
                orphaned.append(task_id)  # hidden until claimed: the claim renews the lease
            else:
                corrections.append((task_id, str(int(reply[1]))))
        now, first, _ = await self._sweep(corrections, 0, hide)
        if len(due) == limit:
            next_in: float | None = 0.0
        else:
            next_in = None if first is None else max(0.0, (float(first) - now) / 1000)
        return Reaped(failed, orphaned, next_in)

    async def claim(
        self,
        task_id: str,
        runner: str,
        lease: float,
        *,
        tools: Collection[str] | None = None,
        grace: float = 0.0,
    ) -> dict[str, Any] | None:
        if self._marker is not None:
            # Read before the claim, so that a task from before the store went
            # back is ended, not run again.
            [read] = await self._seen(
                [_Step(None, args=("HMGET", self.keys(task_id)[0], "c", "st"))]
            )
            if isinstance(read, Exception):
                raise storage_error("task claim", read, self._client)
            created, status = read
            if created is None or status is None:
                return None
            if self._untrusted(int(created), _text(status)):
                await self._end_restored(task_id)
                return None
        served = () if tools is None else (int(grace * 1000), *sorted(tools))
        blob = await self._change("claim", task_id, runner, int(lease * 1000), *served)
        return None if blob is None else unpack(blob)


def _space(namespace: str) -> str:
    """The namespace as it appears in keys (``""`` for none).

    A short name of safe characters is kept readable; any other name (spaces,
    braces, colons, a long one) is replaced by a digest, so keys stay bounded
    and no namespace can be spelled to look like another's keys.
    """
    if not namespace:
        return ""
    if len(namespace) <= 64 and all(c.isascii() and (c.isalnum() or c in "._-") for c in namespace):
        return namespace
    return "#" + hashlib.sha256(namespace.encode()).hexdigest()[:32]

"""The five operations of the Redis backend: open, append, resolve, info, close.

Each is one atomic step in Redis (one Lua operation of :mod:`.scripts`, or
the one pipelined read of :mod:`.fastpath`); the verdict of a resume is
decided here by ``replaystore/rules.py``, the same rules as in memory. A
failed resume the fast read decides is torn down right after that read: by
an optimistic transaction of native commands where the wire sends by hand
(:func:`.teardown.tear_down`; failures that come together share one,
:class:`.teardown.Teardowns`), else by ``fail.lua``; one it leaves in doubt
costs one script when the facts leave no doubt about its failure
(``facts.lua`` tears it down on the state it read, and the rules must reach
the same code from those facts, or the call fails); otherwise it is torn
down by ``close.lua``. Every teardown is a compare-and-delete on the state
the verdict was decided on (judged again if the session moved); the lists a
script could not declare are deleted later, many sessions' in one call
(:class:`.teardown.Leftovers`). Sweeps of evicted
elements and lazy TTL refreshes follow as separate operations only when a
script says they are due.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...cursor import Cursor, event_id, new_epoch, sequence_tag
from ...errors import (
    IdempotencyKeyReusedError,
    SequenceTagCollisionError,
    StorageError,
    StoreRegressedError,
    UnknownSessionError,
    UnsupportedURLError,
)
from ...info import SessionInfo
from ...retention import Retention, run_split_ms
from ...rules import evidence_for, judge, unknown_session
from ...verdicts import Resumption, Verdict
from .. import register_backend
from ..base import Backend
from .client import build_client
from .coordination import OnRedis
from .durability import append_and_wait, appended, check_options, options_from
from .errors import FOREIGN, mapped, storage_error
from .fastpath import Failed, FastPath
from .fences import Fences, behind, end_every, regressed, regressed_answer
from .keys import DEFAULT_PREFIX, meta, run_index, session_keys
from .keys import base as session_base
from .keys import sequence as sequence_key
from .marker import StoreMarker
from .replies import decode_facts, decode_info, decode_tombstone
from .scripts import SLOT, Library, fcall_of
from .teardown import Leftovers, Teardown, Teardowns, still_true, tombstone_head
from .wire import pack_args, talks_to_one_server, wire_for

__all__ = ["DEFAULT_PREFIX", "RedisBackend"]

#: Declared lists per sweep or touch call.
_CHUNK = 1000

T = TypeVar("T")
_Operands = tuple[list[str], list[Any]]


@dataclass(slots=True)
class _Appends:
    """What appends to one sequence of a session send that stays the same, and which form first.

    ``heads``: each form's ``FCALL`` packed up to the payloads.
    ``full_first``: send the full form without trying ``append_lean.lua``,
    which would only answer that the general path is due: before this
    process's first append to the sequence (it may be new), and while the
    session is at its cap (every append evicts).
    """

    heads: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    full_first: bool = True


# A dropped or stale connection (a Redis restart, an idle pooled connection):
# the only failures worth one retry, and only for calls that are safe to repeat.
_RETRYABLE = (RedisConnectionError, RedisTimeoutError)


@register_backend
class RedisBackend(Backend):
    """Session logs in Redis (or Valkey, or a Redis Cluster), shared by every replica."""

    schemes = (
        "redis",
        "rediss",
        "unix",
        "redis+unix",
        "redis+cluster",
        "rediss+cluster",
        "redis+sentinel",
    )

    def __init__(
        self,
        retention: Retention,
        client: Any,
        *,
        prefix: str = DEFAULT_PREFIX,
        owns_client: bool = True,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> None:
        super().__init__(retention)
        if "{" in prefix or "}" in prefix:
            raise UnsupportedURLError("the key prefix must not contain '{' or '}' (hash tags)")
        check_options(wait_replicas, wait_timeout, cluster=isinstance(client, RedisCluster))
        self.client = client
        self.prefix = prefix
        self.wait_replicas = wait_replicas
        self.wait_timeout = wait_timeout
        self._owns_client = owns_client
        self._wire = wire_for(client)
        # Functions where the client talks to one real server directly, else scripts.
        self._library = Library(self._wire.command, functions=talks_to_one_server(client))
        self._fast = FastPath(self._wire, retention, self.key_base)
        slot = client.keyslot if isinstance(client, RedisCluster) else None
        self._leftovers = Leftovers(self._drop, slot=slot)
        self._transactions = self._wire.transactions  # None: failures torn down by script
        self._teardowns = Teardowns(self._transactions) if self._transactions else None
        # What appends to a sequence send that stays the same, per (session, sequence).
        self._appends: dict[tuple[str, str], _Appends] = {}
        # append_lean.lua leaves run splits by age to the general path.
        self._lean = run_split_ms(retention) == 0
        self._fences = Fences()  # what this process was handed (a failover may lose it)
        self._disconnected = False  # a connection failed since the fences were last checked
        self._end_restored = end = partial(self._end_regressed, code="store_restored")
        self.marker = StoreMarker(self._wire.command, prefix, partial(end_every, self._fences, end))

    @classmethod
    def from_url(
        cls, url: str, retention: Retention, *, client: Any = None, **options: Any
    ) -> RedisBackend:
        url, durability = options_from(url, options)
        client, prefix, owns = build_client(url, client=client, **options)
        return cls(
            retention, client, prefix=prefix or DEFAULT_PREFIX, owns_client=owns, **durability
        )

    def coordination(self) -> OnRedis:
        """Replicas share this Redis: registry keys beside the session's, pub/sub notifications."""
        shared = (self.client, self.prefix, self.key_base, self._wire)
        return OnRedis(*shared, self.marker, self._end_restored)

    # -- keys ----------------------------------------------------------------

    def key_base(self, session: str) -> str:
        """The prefix of every key of ``session``, hash tag included (:func:`.keys.base`).

        Other modules put their own keys of a session behind this base to land
        in the same Redis Cluster slot.
        """
        return session_base(self.prefix, session)

    def _keys(self, session: str, tags: Sequence[str] = ()) -> list[str]:
        return session_keys(self.key_base(session), tags)

    # -- calls ---------------------------------------------------------------

    async def _call(self, what: str, call: Callable[[], Awaitable[T]], *, retry: bool) -> T:
        """One call to Redis; its foreign errors become :class:`StorageError` (:mod:`.errors`).

        ``retry`` (for calls that are safe to repeat) sends the call once more
        after a connection error: a pooled connection that died with a
        restarted server fails the first call that uses it.
        """
        with mapped(what, self.client):
            try:
                return await call()
            except _RETRYABLE:
                self._disconnected = True
                if not retry:
                    raise
                return await call()

    async def _again(self, what: str, exc: BaseException, call: Callable[[], Awaitable[T]]) -> T:
        """What :meth:`_call` (``retry=True``) makes of a first try of ``call`` that raised
        ``exc`` (one of the store's errors), for a caller that made that try itself."""
        if not isinstance(exc, _RETRYABLE):
            raise storage_error(what, exc, self.client) from exc
        self._disconnected = True
        return await self._call(what, call, retry=False)

    async def _run(
        self, name: str, session: str, tags: Sequence[str], args: Sequence[Any], *, retry: bool
    ) -> Any:
        keys = self._keys(session, tags)
        argv = [len(tags), *tags, *args]
        return await self._call(
            name, lambda: self._library.call(name, lambda: (keys, argv)), retry=retry
        )

    async def _written(
        self, name: str, keys: list[str], args: list[Any], *, opening: bool = False
    ) -> Any:
        """A write (an append of either form, or ``open``), with ``WAIT`` when ``wait_replicas``
        asks for durability (:mod:`.durability`); opening a session always stores."""
        if not self.wait_replicas:
            return await self._library.call(name, lambda: (keys, args))
        return await append_and_wait(
            lambda send: self._library.call(name, lambda: (keys, args), send),
            self._wire.pipeline,
            self.wait_replicas,
            self.wait_timeout,
            stored=bool if opening else appended,
        )

    async def _maintain(self, session: str, sweep: list[bytes], touch: list[bytes]) -> None:
        """Sweeps and TTL refreshes a script asked for, with the lists declared."""
        for name, tags in (("sweep", sweep), ("touch", touch)):
            names = [t.decode() for t in tags]
            for start in range(0, len(names), _CHUNK):
                await self._run(name, session, names[start : start + _CHUNK], [], retry=True)

    async def connect(self) -> None:
        try:
            if isinstance(self.client, RedisCluster):
                await self.client.initialize()
            else:
                await self.client.ping()
        except ResponseError as exc:
            # Reached, then refused: a database past the server's `databases`
            # setting is a configuration to fix, not a server to wait for.
            raise storage_error("connecting", exc) from exc
        except FOREIGN as exc:
            raise StorageError(f"cannot reach redis: {exc}") from exc

    async def _drop(self, keys: list[str], args: list[Any]) -> Any:
        """``drop.lua`` on leftover lists of torn-down sessions (one slot per call on a cluster)."""
        return await self._call(
            "drop", lambda: self._library.call("drop", lambda: (keys, args)), retry=True
        )

    async def aclose(self) -> None:
        if self._teardowns is not None:
            await self._teardowns.aclose()
        await self._leftovers.aclose()
        await self._wire.give_back()  # a client passed in gets its connections back
        if self._owns_client:
            await self.client.aclose()
            pool = getattr(self.client, "connection_pool", None)
            if isinstance(pool, SentinelConnectionPool):
                # master_for's client leaves the Sentinel's own clients open.
                for sentinel in pool.sentinel_manager.sentinels:
                    await sentinel.aclose()

    @property
    def _sweep_threshold(self) -> int:
        return max(16, self.retention.max_events // 16)

    # -- the contract ----------------------------------------------------------

    async def open_session(self, session: str) -> SessionInfo:
        r = self.retention
        args = [0, new_epoch(), r.session_ttl_ms, r.max_events, r.max_age_ms]
        # With wait_replicas a session is durable once opened, as its events are
        # once appended: one that a failover would lose is refused up front.
        out = await self._call(
            "open",
            lambda: self._written("open", self._keys(session), args, opening=True),
            retry=True,
        )
        await self._maintain(session, [], out[4])
        return decode_info(session, out[:4], out[5:])

    async def session_info(self, session: str) -> SessionInfo | None:
        r = self.retention
        out = await self._run("info", session, (), [r.max_events, r.max_age_ms], retry=True)
        return None if out is None else decode_info(session, out[:4], out[4:])

    def _append_args(self, sequence: str, tag: str) -> list[Any]:
        """``append.lua``'s arguments that stay the same for a sequence (and its list)."""
        r = self.retention
        settings = (
            r.max_events,
            self._sweep_threshold,
            run_split_ms(r),
            r.max_age_ms,
            r.session_ttl_ms,
            r.tombstone_ttl_ms,
            '{"code":"index_lost"',  # the tombstone if the run index turns out lost
        )
        return [1, tag, sequence.encode("utf-8"), ",".join(map(str, settings))]

    def _operands(self, form: str, session: str, sequence: str, tag: str) -> _Operands:
        """The keys and the arguments that stay the same, of ``append`` or ``append_lean``."""
        if form == "append":
            return self._keys(session, [tag]), self._append_args(sequence, tag)
        base = self.key_base(session)
        return (
            [meta(base), run_index(base), sequence_key(base, tag)],
            [
                f"s:{tag}",
                sequence.encode("utf-8"),
                self.retention.max_events,
                self._sweep_threshold,
            ],
        )

    def _head(self, form: str, session: str, sequence: str, tag: str) -> tuple[bytes, int]:
        """The packed ``FCALL`` of ``form`` up to the payloads, and its count of arguments.

        Packing an append's arguments costs more client time than Redis
        spends running it; all but the payloads are the same for every
        append to a sequence, so they are packed once.
        """
        head = fcall_of(form, partial(self._operands, form, session, sequence, tag))
        return pack_args(head), len(head)

    def _appends_to(self, session: str, sequence: str) -> _Appends:
        cache = self._appends.get((session, sequence))
        if cache is None:
            if len(self._appends) > 10_000:
                self._appends.clear()
            cache = self._appends[(session, sequence)] = _Appends()
        return cache

    async def _send_append(
        self,
        form: str,
        session: str,
        sequence: str,
        tag: str,
        cache: _Appends,
        tail: list[bytes],
        *,
        retry: bool,
    ) -> Any:
        """One call of ``form`` (``append`` or ``append_lean``), ``tail`` after its fixed part."""

        def operands() -> tuple[list[str], list[Any]]:
            keys, args = self._operands(form, session, sequence, tag)
            return keys, [*args, *tail]

        if self.wait_replicas:
            keys, args = operands()
            return await self._call("append", lambda: self._written(form, keys, args), retry=retry)
        if not self._library.functions:
            return await self._call(
                "append", lambda: self._library.call(form, operands), retry=retry
            )
        head = cache.heads.get(form)
        if head is None:
            head = cache.heads[form] = self._head(form, session, sequence, tag)
        packet = b"*%d\r\n" % (head[1] + len(tail)) + head[0] + pack_args(tail)
        send = partial(self._wire.call, packet, partial(fcall_of, form, operands))
        return await self._call(
            "append", lambda: self._library.call(form, operands, packed=send), retry=retry
        )

    async def append(
        self,
        session: str,
        sequence: str,
        payloads: Sequence[bytes | None],
        *,
        idempotency_key: str | None = None,
    ) -> list[str]:
        if self._disconnected:
            await self.check_fences()
        tag = sequence_tag(sequence)
        cache = self._appends_to(session, sequence)
        fence = self._fences.packed(session)
        tail: list[bytes]
        out: Any = None
        if len(payloads) == 1 and payloads[0] is not None and not idempotency_key:
            # the common append: lean first, unless it is known to need more
            tail = [fence, payloads[0]]
            if self._lean and not cache.full_first:
                out = await self._send_append(
                    "append_lean", session, sequence, tag, cache, tail, retry=False
                )
                if out and out[1] == b"general":
                    out = None
                elif not out:
                    raise UnknownSessionError(session)
        else:
            kinds = (
                b"" if None not in payloads else bytes(112 if p is None else 100 for p in payloads)
            )
            tail = [
                fence,
                kinds,
                (idempotency_key or "").encode(),
                *(b"" if p is None else p for p in payloads),
            ]
        if out is None:
            out = await self._send_append(
                "append", session, sequence, tag, cache, tail, retry=idempotency_key is not None
            )
            if not out:
                raise UnknownSessionError(session)
            cache.full_first = out[1] == b"full"
        epoch, status = out[0].decode(), out[1]
        if status == b"lost":
            await self._sweep_lists(session, out[2:])
            raise UnknownSessionError(session)
        if status == b"regressed":
            await self._end_regressed(session, epoch)
            raise StoreRegressedError(session)
        if status == b"collision":
            raise SequenceTagCollisionError(sequence)
        parts = [item.split(".") for item in out[2].decode().split(",")]
        ids = [event_id(epoch, pos, tag, ordinal, stamp) for pos, ordinal, stamp in parts]
        self._fences.handed(session, epoch, int(parts[-1][0]))
        if status == b"dup":
            if len(ids) != len(payloads):
                raise IdempotencyKeyReusedError(idempotency_key or "")
            return ids
        if len(out) > 3:  # sweeps or a TTL refresh due
            await self._maintain(session, out[3], out[4])
        return ids

    async def close_session(self, session: str, *, tombstone_ttl: float | None = None) -> bool:
        self._fences.forget(session)
        kept = None if tombstone_ttl is None else max(1, round(tombstone_ttl * 1000))
        return await self._close(session, '{"code":"closed"', ("", "always", ""), tomb_ms=kept)

    async def _close(
        self,
        session: str,
        tomb: str,
        expect: tuple[str, str, Any],
        tags: Sequence[str] = (),
        *,
        later: bool = False,
        tomb_ms: int | None = None,
    ) -> bool:
        """Delete the session (while ``expect`` holds: see ``close.lua``), then its lists.

        The lists of ``tags`` go in the same call; the others follow in sweeps,
        at once, or ``later`` in a batch with other sessions' (a failed
        resume: its caller needs only the verdict).
        """
        nonce = secrets.token_hex(8)
        out = await self._run(
            "close",
            session,
            tags,
            [tomb, tomb_ms or self.retention.tombstone_ttl_ms, nonce, *expect],
            retry=True,
        )
        if not int(out[0]):
            return False
        if later:
            self._later(session, out[1:])
        else:
            await self._sweep_lists(session, out[1:])
        return True

    def _later(self, session: str, tags: list[bytes]) -> None:
        """The lists of ``tags`` of a torn-down session, to the next batch of leftovers."""
        base = self.key_base(session)
        lists = [sequence_key(base, tag) for tag in sorted({t.decode() for t in tags})]
        self._leftovers.add(meta(base), lists)

    async def _sweep_lists(self, session: str, tags: list[bytes]) -> None:
        """Delete the lists of a session that is gone (named by the script that removed it)."""
        names = sorted({t.decode() for t in tags})
        for start in range(0, len(names), _CHUNK):
            await self._run("sweep", session, names[start : start + _CHUNK], [], retry=True)

    def _facts_args(
        self, cursor: Cursor | None, sequence: str | None, *, replay: bool, teardown: str
    ) -> list[Any]:
        """``facts.lua``'s arguments; ``teardown`` as that script describes it."""
        r = self.retention
        return [
            1 if cursor else 0,
            cursor.position if cursor else 0,
            cursor.tag or "" if cursor else "",
            cursor.ordinal or 0 if cursor else 0,
            sequence_tag(sequence) if sequence is not None else "",
            1 if replay else 0,
            r.max_events,
            r.max_age_ms,
            r.session_ttl_ms,
            self._sweep_threshold,
            cursor.epoch if cursor else "",
            "" if cursor is None or cursor.stamp is None else cursor.stamp,
            (sequence or "").encode("utf-8"),
            teardown,
        ]

    async def resolve(
        self,
        session: str,
        cursor: Cursor | None,
        raw_cursor: str,
        sequence: str | None,
        *,
        replay: bool,
        teardown: bool,
    ) -> Resumption:
        if self._disconnected:
            await self.check_fences()
        # The fence as it was before the read: any position in it was issued
        # before the read began, so a high-water read below it is a regression.
        fence = self._fences.get(session)
        fast: Resumption | Failed | None = None
        if replay and cursor is not None and cursor.tag is not None:
            # The fast read, awaited here rather than through ``_call`` (a
            # layer per step of every resume): its errors take the same way.
            try:
                fast = await self._fast.snapshot(session, cursor, raw_cursor, sequence)
            except FOREIGN as exc:
                fast = await self._again(
                    "resolve",
                    exc,
                    lambda: self._fast.snapshot(session, cursor, raw_cursor, sequence),
                )
        if isinstance(fast, Resumption):
            out = fast
        else:
            out = await self._resolve(session, cursor, raw_cursor, sequence, replay, teardown, fast)
        if not regressed(out, fence):
            return out
        if replay and teardown:
            await self._end_regressed(session, out.evidence.epoch or "")
        return regressed_answer(out, replay and teardown)

    async def check_fences(self) -> list[str]:
        """End every session whose store lost positions this process was handed (after a
        lost connection, before the next append or resume); the sessions ended."""
        self._disconnected = False
        try:
            await self.marker.look()  # a restore from an older snapshot ends every fenced one
            return await behind(
                self._fences, self.client, lambda s: meta(self.key_base(s)), self._end_regressed
            )
        except FOREIGN as exc:
            self._disconnected = True  # still unreachable: check again next time
            raise storage_error("checking for lost appends", exc, self.client) from exc

    async def _end_regressed(self, session: str, epoch: str, code: str = "store_regressed") -> None:
        """End ``session`` (incarnation ``epoch`` or any) for every replica: the store lost appends.

        Once the lost positions are issued again the loss stays true, so the
        teardown needs no condition beyond the incarnation.
        """
        self._fences.forget(session)
        tomb = tombstone_head(code, Verdict.STORE_REGRESSED.value)
        await self._close(session, tomb, (epoch, "always", ""), later=True)

    async def _resolve(
        self,
        session: str,
        cursor: Cursor | None,
        raw_cursor: str,
        sequence: str | None,
        replay: bool,
        teardown: bool,
        fast: Failed | None,
    ) -> Resumption:
        """A resume the fast read did not answer: ``fast``, a failure it decided (torn down
        here), else the facts script judges (see :meth:`resolve`)."""
        # On a cluster too: the pipelined read follows MOVED and ASK while a
        # slot moves, and needs no transaction (see ``FastPath.snapshot``), so the
        # two reads may even be served by the two nodes of a moving slot.
        r = self.retention
        named_tag = sequence_tag(sequence) if sequence is not None else ""
        if fast is not None:
            assert cursor is not None  # a fast read needs one
            done = await self._fail_fast(session, cursor, raw_cursor, named_tag, fast, teardown)
            if done is not None:
                return done
        declared = [t for t in (cursor.tag if cursor else None, named_tag) if t]
        torn_down = replay and teardown
        nonce = secrets.token_hex(8)
        for _ in range(8):
            tags = sorted(set(declared))
            spec = f"{r.tombstone_ttl_ms},{nonce}" if torn_down else ""
            out = await self._run(
                "facts",
                session,
                tags,
                self._facts_args(cursor, sequence, replay=replay, teardown=spec),
                retry=True,
            )
            status = out[SLOT["status"]]
            if status == b"gone":
                tomb = decode_tombstone(out[SLOT["tombstone"]])
                if tomb is not None and f'"id":"{nonce}"'.encode() in out[SLOT["tombstone"]]:
                    # This call's own teardown, its reply lost and the call sent again.
                    evidence = unknown_session(session, raw_cursor, tomb)
                    return Resumption(tomb.verdict or Verdict.UNKNOWN_SESSION, evidence, sequence)
                evidence = unknown_session(session, raw_cursor, tomb)
                return Resumption(Verdict.UNKNOWN_SESSION, evidence, sequence)
            if status == b"need":
                declared.append(out[SLOT["need_tag"]].decode())
                continue
            facts = decode_facts(out)
            judgement = judge(facts, cursor, sequence)
            failed = judgement.verdict is not Verdict.RESUMED
            if status == b"torn":
                # Torn down by the script on the facts it read: the rules must agree.
                if judgement.code != out[SLOT["torn"]].decode():
                    raise StorageError(
                        f"the teardown script decided {out[SLOT['torn']].decode()!r} where "
                        f"the rules decide {judgement.code!r}"
                    )
                self._later(session, out[SLOT["sweep"]])
            else:
                await self._maintain(session, out[SLOT["sweep"]], out[SLOT["touch"]])
                if failed and torn_down:
                    tomb_json = tombstone_head(judgement.code, judgement.verdict.value)
                    expect = (facts.epoch, *still_true(judgement.code, cursor, named_tag))
                    if not await self._close(session, tomb_json, expect, tags, later=True):
                        continue  # the session moved since the facts were read: judge again
            evidence = evidence_for(
                session,
                raw_cursor,
                cursor,
                facts,
                judgement,
                torn_down=failed and torn_down,
                replay=replay,
            )
            events = judgement.chain.events(facts.epoch) if replay and not failed else []
            return Resumption(judgement.verdict, evidence, judgement.sequence, events)
        raise StorageError("the session kept changing while a resume was judged; try again")

    async def _fail_fast(
        self,
        session: str,
        cursor: Cursor,
        raw_cursor: str,
        named_tag: str,
        fast: Failed,
        teardown: bool,
    ) -> Resumption | None:
        """A failure the fast read decided, torn down without the facts script.

        Both teardowns check that the session is still the incarnation read
        and the verdict's condition still holds (:func:`.teardown.still_holds`),
        and leave the tombstone. Where the wire sends commands by hand (one
        server: plain or behind Sentinel) it is an optimistic transaction of
        native commands (:func:`.teardown.tear_down`), which deletes every list
        too: Redis runs a command sent to it for less than the same command
        called from Lua, and a script call costs more than its commands.
        Elsewhere (a cluster, clients the wire does not handle) it is one
        ``fail.lua`` call, which deletes the lists it declares (the cursor's
        and the named sequence's) and leaves the others to a batch
        (:class:`.teardown.Leftovers`). ``None`` when the session moved
        meanwhile: the script path judges again.
        """
        judgement = fast.judgement
        if teardown:
            condition = still_true(judgement.code, cursor, named_tag)
            tomb = tombstone_head(judgement.code, judgement.verdict.value)
            nonce = secrets.token_hex(8)
            tx, teardowns = self._transactions, self._teardowns
            if tx is not None and teardowns is not None:
                request = Teardown(
                    self.key_base(session),
                    fast.facts.epoch,
                    condition,
                    tomb,
                    self.retention.tombstone_ttl_ms,
                    nonce,
                )
                async with tx.held():
                    torn = await self._call(
                        "resolve", lambda: teardowns.submit(request), retry=True
                    )
            else:
                torn = await self._fail_script(
                    session, cursor, named_tag, fast, condition, tomb, nonce
                )
            if not torn:
                return None
        evidence = evidence_for(
            session, raw_cursor, cursor, fast.facts, judgement, torn_down=teardown, replay=True
        )
        return Resumption(judgement.verdict, evidence, judgement.sequence)

    async def _fail_script(
        self,
        session: str,
        cursor: Cursor,
        named_tag: str,
        fast: Failed,
        condition: tuple[str, Any],
        tomb: str,
        nonce: str,
    ) -> bool:
        """``fail.lua`` on the session; its undeclared lists to the next batch of leftovers."""
        tags = sorted({t for t in (cursor.tag, named_tag) if t})
        args = [
            fast.facts.epoch,
            *condition,
            tomb,
            self.retention.tombstone_ttl_ms,
            nonce,
            int(time.time() * 1000),
        ]
        out = await self._run("fail", session, tags, args, retry=True)
        if not int(out[0]):
            return False
        self._later(session, out[1:])
        return True

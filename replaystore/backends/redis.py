"""``redis://``, ``rediss://``, ``redis+unix://``, ``redis+cluster://``, ``redis+sentinel://``.

The layout is drawn in ``docs/data-layout.md``: one list of events per
sequence, a run index that maps positions to sequences, and a meta hash with
the bookkeeping. Every key of a session carries the session's hash tag (one
Redis Cluster slot), and every key a script touches is declared in ``KEYS``.

How a call reaches Redis:

* a resume whose cursor carries a hint reads the meta hash and a native
  ``LRANGE`` of the sequence's list in one pipelined round trip (no Lua, no
  ``MULTI``: see ``_snapshot`` for why none is needed) and judges them here;
  only a read in doubt goes further;
* otherwise ``facts.lua`` gathers the facts in one script, the verdict is
  decided here (``replaystore/_rules.py``, the same rules as in memory), and a
  failed resume is torn down by ``close.lua`` as a compare-and-delete on the
  state the verdict was decided on (judged again if the session moved);
* appends are one ``append.lua`` each (a whole batch); sweeps of evicted
  elements and lazy TTL refreshes follow as separate scripts only when due.

The operations run as one Redis function library (``FCALL``, loaded on first
use) on clients that talk to one server, and as scripts (EVALSHA, re-sent with
EVAL on NOSCRIPT) on a cluster, on fakes, on a read-only replica, with
``wait_replicas`` and where an ACL refuses functions. URL forms (query
``prefix=`` sets the key prefix, default ``replaystore:``)::

    redis://[[user]:password@]host[:port][/db][?prefix=app1:]
    rediss://...                                  (TLS; ssl_* query options as in redis-py)
    redis+unix:///path/to/redis.sock[?db=0]
    redis+cluster://[[user]:password@]host:port[,host:port...][?prefix=...]
    rediss+cluster://...                          (TLS)
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]

``wait_replicas=N`` (and ``wait_timeout=SECONDS``, default 1), in the query or
as ``from_url`` options, makes every append wait until ``N`` replicas
acknowledged it (Redis ``WAIT``, sent with the append on the same connection);
an append that is not acknowledged in time raises :class:`StorageError`
(standalone and Sentinel deployments).

``from_url(..., client=...)`` takes a ready ``redis.asyncio`` client instead
(fakeredis in tests, or a client the application already configured); it must
not decode responses.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import operator
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import repeat
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    NoPermissionError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._rules import Record, SequenceState, Stored, evidence_for, judge, unknown_session
from ..cursor import Cursor, event_id, new_epoch, sequence_tag
from ..errors import (
    IdempotencyKeyReusedError,
    SequenceTagCollisionError,
    StorageError,
    UnknownSessionError,
    UnsupportedURLError,
)
from ..info import SessionInfo
from ..retention import EVICTED_SEQUENCES, Retention, run_split_ms
from ..verdicts import Resumption, Tombstone, Verdict, reason_text
from . import register_backend
from ._redis_client import build_client
from .base import Backend
from .coordination import OnRedis

__all__ = ["RedisBackend"]

DEFAULT_PREFIX = "replaystore:"

#: The slots of ``facts.lua``'s reply, in order. The script reads them from a
#: generated ``SLOT`` table, so this tuple is the one place that names them.
FACT_SLOTS = (
    "status",
    "tombstone",
    "need_tag",
    "epoch",
    "top",
    "floor",
    "count",
    "nseq",
    "named_state",
    "record_tag",
    "record_ordinal",
    "record_element",
    "chain_tag",
    "chain_state",
    "chain_ordinal",
    "evicted_element",
    "touch",
    "sweep",
)
_SLOT = {name: index for index, name in enumerate(FACT_SLOTS)}
_PRELUDE = (
    "local SLOT = {"
    + ", ".join(f"{name} = {index + 1}" for index, name in enumerate(FACT_SLOTS))
    + f", _n = {len(FACT_SLOTS)}}}\n"
    + f"local EVICTED_SEQUENCES = {EVICTED_SEQUENCES}\n"
)
#: Keys every script gets, in ``KEYS`` order; sequence lists follow.
_FIXED = ("m", "i", "g", "t", "k", "k2", "x")
#: Declared lists per sweep or touch call.
_CHUNK = 1000

T = TypeVar("T")

# A dropped or stale connection (a Redis restart, an idle pooled connection):
# the only failures worth one retry, and only for calls that are safe to repeat.
_RETRYABLE = (RedisConnectionError, RedisTimeoutError)


_OPERATIONS = ("open", "append", "facts", "info", "close", "sweep", "touch")


def _lua(name: str) -> str:
    return (resources.files("replaystore.backends") / "lua" / name).read_text()


_LIB = _PRELUDE + _lua("_lib.lua") + "\n"
_BODIES = {
    name: f"local function op_{name}()\n{_lua(f'{name}.lua')}\nend\n" for name in _OPERATIONS
}


@dataclass(frozen=True, slots=True)
class _Script:
    """One operation as an EVAL script: the slot table, the helpers, the operation, a call."""

    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> _Script:
        source = _LIB + _BODIES[name] + f"return run(op_{name}, KEYS, ARGV)\n"
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


_SCRIPTS = {name: _Script.load(name) for name in _OPERATIONS}

#: The same operations as one function library (Redis 7+, Valkey): the helpers
#: are defined once when it is loaded, not on every call as in a script. The
#: name carries a hash of the code, so a server never runs another version's.
_LIBRARY_ID = hashlib.sha1("".join(s.source for s in _SCRIPTS.values()).encode()).hexdigest()[:12]
_FUNCTIONS = {name: f"replaystore_{_LIBRARY_ID}_{name}" for name in _OPERATIONS}
_LIBRARY = (
    f"#!lua name=replaystore_{_LIBRARY_ID}\n"
    + _LIB
    + "".join(_BODIES.values())
    + "".join(
        f"redis.register_function('{_FUNCTIONS[name]}', "
        f"function(keys, argv) return run(op_{name}, keys, argv) end)\n"
        for name in _OPERATIONS
    )
)


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
        if isinstance(wait_replicas, bool) or not isinstance(wait_replicas, int):
            raise UnsupportedURLError("wait_replicas must be an integer")
        if wait_replicas < 0 or not 0 < wait_timeout <= 3600:
            raise UnsupportedURLError("wait_replicas >= 0 and 0 < wait_timeout <= 3600 seconds")
        if wait_replicas and isinstance(client, RedisCluster):
            raise UnsupportedURLError("wait_replicas is not supported on redis+cluster://")
        self.client = client
        self.prefix = prefix
        self.wait_replicas = wait_replicas
        self.wait_timeout = wait_timeout
        self._owns_client = owns_client
        # Calls of this backend waiting for Redis (see ``_send``).
        self._in_flight = 0
        # The fast path's reads, per (session, sequence tag, named sequence).
        self._reads: dict[tuple[str, str, str | None], _Read] = {}
        # Packed append commands up to their payloads, per (session, sequence).
        self._heads: dict[tuple[str, str], tuple[bytes, int]] = {}
        # A plain redis-py client over real connections: commands and pipelines
        # are sent by hand (one packet, replies unparsed), which costs a
        # fraction of a redis-py Pipeline. Cluster clients and fakes go through
        # redis-py.
        pool = getattr(client, "connection_pool", None)
        self._by_hand = (
            isinstance(client, Redis)
            and isinstance(pool, ConnectionPool)
            and getattr(pool, "connection_class", type).__module__.startswith("redis.")
        )
        # Operations run as a function library where the client talks to one
        # real server directly; elsewhere (a cluster, fakes) as scripts.
        self._functions = self._by_hand

    @classmethod
    def from_url(
        cls, url: str, retention: Retention, *, client: Any = None, **options: Any
    ) -> RedisBackend:
        url, durability = _durability_options(url, options)
        client, prefix, owns = build_client(url, client=client, **options)
        return cls(
            retention, client, prefix=prefix or DEFAULT_PREFIX, owns_client=owns, **durability
        )

    def coordination(self) -> OnRedis:
        """Replicas share this Redis: registry keys beside the session's, pub/sub notifications."""
        return OnRedis(self.client, self.prefix, self.key_base)

    # -- keys ----------------------------------------------------------------

    def key_base(self, session: str) -> str:
        """The prefix of every key of ``session``, hash tag included.

        Redis Cluster hashes the text between the first ``{`` and the next
        ``}``; a session id containing braces would cut that tag short (or
        empty it, spreading the keys over several slots), so such ids are
        written as hex behind a space, which no session id can contain. Other
        modules put their own keys of a session behind this base to land in
        the same slot.
        """
        tag = session if "{" not in session and "}" not in session else " " + session.encode().hex()
        return f"{self.prefix}{{{tag}}}"

    def _keys(self, session: str, tags: Sequence[str] = ()) -> list[str]:
        base = self.key_base(session)
        return [f"{base}:{name}" for name in _FIXED] + [f"{base}:q:{tag}" for tag in tags]

    # -- calls ---------------------------------------------------------------

    async def _call(self, what: str, call: Callable[[], Awaitable[T]], *, retry: bool) -> T:
        """The one place where redis-py's exceptions become :class:`StorageError`.

        ``retry`` (for calls that are safe to repeat) sends the call once more
        after a connection error: a pooled connection that died with a
        restarted server fails the first call that uses it.
        """
        try:
            try:
                return await call()
            except _RETRYABLE:
                if not retry:
                    raise
                return await call()
        except (RedisError, RedisClusterException) as exc:
            # RedisClusterException (no reachable node, slot not covered) is
            # not a RedisError.
            raise StorageError(f"{what} failed on redis: {exc}") from exc

    async def _eval(self, name: str, keys: list[str], args: list[Any]) -> Any:
        if self._functions:
            try:
                return await self._command("FCALL", _FUNCTIONS[name], len(keys), *keys, *args)
            except ResponseError as exc:
                text = str(exc).lower()
                if "read only replica" in text:
                    # a function may write, so a replica refuses any; a read
                    # that writes nothing still runs there as a script
                    return await self._script(name, keys, args)
                if isinstance(exc, NoPermissionError) or "unknown command" in text:
                    # an ACL that allows scripts but not functions, or a
                    # server without them: scripts from now on
                    self._functions = False
                    return await self._script(name, keys, args)
                if "function not found" not in text:
                    raise
            # Functions are lost with a restart without persistence, or never
            # loaded: load the library (once) and call again; a server that
            # refuses it (no permission, no functions) gets scripts instead.
            try:
                await self._command("FUNCTION", "LOAD", "REPLACE", _LIBRARY)
            except ResponseError:
                self._functions = False
            else:
                try:
                    return await self._command("FCALL", _FUNCTIONS[name], len(keys), *keys, *args)
                except ResponseError as exc:
                    if "function not found" not in str(exc).lower():
                        raise
                    # flushed again in between: this call runs as a script
        return await self._script(name, keys, args)

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        script = _SCRIPTS[name]
        try:
            return await self._command("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            # The script cache is volatile; EVAL runs and re-caches it.
            return await self._command("EVAL", script.source, len(keys), *keys, *args)

    async def _command(self, *command: Any) -> Any:
        """One command; sent by hand on a plain client (see ``_by_hand``)."""
        if not self._by_hand:
            return await self.client.execute_command(*command)
        return await self._roundtrip(_pack_one(command))

    async def _roundtrip(self, packet: bytes) -> Any:
        """One packed command on a pooled connection, its reply as Redis sent it."""
        pool = self.client.connection_pool
        conn = await pool.get_connection()
        self._in_flight += 1
        try:
            await _send(conn, packet, crowded=self._in_flight > 1)
            return await conn.read_response()
        except RedisError as exc:
            if not isinstance(exc, RedisConnectionError | RedisTimeoutError):
                raise  # an error reply: the connection is in step
            await _drop(conn)
            raise
        except BaseException:
            await _drop(conn)
            raise
        finally:
            self._in_flight -= 1
            await pool.release(conn)

    async def _run(
        self, name: str, session: str, tags: Sequence[str], args: Sequence[Any], *, retry: bool
    ) -> Any:
        keys = self._keys(session, tags)
        argv = [len(tags), *tags, *args]
        return await self._call(name, lambda: self._eval(name, keys, argv), retry=retry)

    async def _append_and_wait(self, keys: list[str], args: list[Any]) -> Any:
        """The append and ``WAIT`` in one round trip, on one connection."""
        wait = ("WAIT", self.wait_replicas, round(self.wait_timeout * 1000))
        calls: list[tuple[Any, ...]] = []
        if self._functions:
            calls.append(("FCALL", _FUNCTIONS["append"], len(keys), *keys, *args))
        script = _SCRIPTS["append"]
        calls.append(("EVALSHA", script.sha, len(keys), *keys, *args))
        calls.append(("EVAL", script.source, len(keys), *keys, *args))
        for call in calls:
            out, acked = await self._pipeline([call, wait], slack=self.wait_timeout)
            if isinstance(out, NoScriptError) or (call[0] == "FCALL" and _not_run(out)):
                continue  # not loaded or not allowed here: the script forms work everywhere
            if isinstance(out, Exception):
                raise out
            if isinstance(acked, Exception):
                raise acked
            if out and out[1] == b"ok" and int(acked) < self.wait_replicas:
                raise StorageError(
                    f"append stored on the primary but acknowledged by {acked} of "
                    f"{self.wait_replicas} replica(s) within {self.wait_timeout} s"
                )
            return out
        raise StorageError("the append script could not be loaded")

    async def _pipeline(
        self, commands: Sequence[tuple[Any, ...]], *, slack: float = 0.0
    ) -> list[Any]:
        """Commands in one packet on one connection; replies in order, error replies as values.

        ``slack``: how long a command may block in Redis beyond the socket
        timeout (a ``WAIT``), added to the replies' timer.
        """
        if not self._by_hand:
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))
        packet = b"".join(_pack_one(command) for command in commands)
        return await self._pipelined(packet, len(commands), slack=slack)

    async def _pipelined(self, packet: bytes, replies: int, *, slack: float = 0.0) -> list[Any]:
        """A packet of ``replies`` commands sent by hand; the replies in order, errors as values.

        The replies come back together (one packet in, one out), so they are
        read under one timer of the socket timeout rather than one timer each,
        which would cost more than the reads: a server that stops halfway still
        cannot hold the call longer.
        """
        pool = self.client.connection_pool
        conn = await pool.get_connection()
        self._in_flight += 1
        try:
            await _send(conn, packet, crowded=self._in_flight > 1)
            out = []
            timeout = conn.socket_timeout
            try:
                async with asyncio.timeout(None if timeout is None else timeout + slack):
                    for _ in range(replies):
                        out.append(await _reply(conn))
            except TimeoutError as exc:
                raise RedisTimeoutError("timeout reading pipelined replies") from exc
            return out
        except BaseException:
            await _drop(conn)
            raise
        finally:
            self._in_flight -= 1
            await pool.release(conn)

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
            raise StorageError(f"redis refused the connection: {exc}") from exc
        except (RedisError, RedisClusterException) as exc:
            raise StorageError(f"cannot reach redis: {exc}") from exc

    async def aclose(self) -> None:
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
        out = await self._run(
            "open",
            session,
            (),
            [new_epoch(), r.session_ttl_ms, r.max_events, r.max_age_ms],
            retry=True,
        )
        await self._maintain(session, [], out[4])
        return _info(session, out[:4], out[5:])

    async def session_info(self, session: str) -> SessionInfo | None:
        r = self.retention
        out = await self._run("info", session, (), [r.max_events, r.max_age_ms], retry=True)
        return None if out is None else _info(session, out[:4], out[4:])

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

    def _append_head(self, session: str, sequence: str, tag: str) -> tuple[bytes, int]:
        """The packed ``FCALL`` up to the arguments that change per append, and their count.

        Packing an append's twenty-odd arguments costs more client time than
        Redis spends running it; all but the payloads are the same for every
        append to a sequence, so they are packed once.
        """
        cached = self._heads.get((session, sequence))
        if cached is None:
            keys = self._keys(session, [tag])
            head = [
                "FCALL",
                _FUNCTIONS["append"],
                len(keys),
                *keys,
                *self._append_args(sequence, tag),
            ]
            if len(self._heads) > 10_000:
                self._heads.clear()
            cached = self._heads[(session, sequence)] = (_pack_args(head), len(head))
        return cached

    async def _append_packed(
        self, packet: bytes, session: str, sequence: str, tag: str, tail: list[Any]
    ) -> Any:
        try:
            return await self._roundtrip(packet)
        except ResponseError as exc:
            if not _not_run(exc) and "read only replica" not in str(exc).lower():
                raise
        # not loaded (or not allowed) here: the general path loads it or uses scripts
        keys = self._keys(session, [tag])
        return await self._eval("append", keys, [*self._append_args(sequence, tag), *tail])

    async def append(
        self,
        session: str,
        sequence: str,
        payloads: Sequence[bytes | None],
        *,
        idempotency_key: str | None = None,
    ) -> list[str]:
        tag = sequence_tag(sequence)
        kinds = b"" if None not in payloads else bytes(112 if p is None else 100 for p in payloads)
        tail = [
            kinds,
            (idempotency_key or "").encode(),
            *(b"" if p is None else p for p in payloads),
        ]
        retry = idempotency_key is not None
        if self._functions and not self.wait_replicas:
            head, count = self._append_head(session, sequence, tag)
            packet = b"*%d\r\n" % (count + len(tail)) + head + _pack_args(tail)
            out = await self._call(
                "append",
                lambda: self._append_packed(packet, session, sequence, tag, tail),
                retry=retry,
            )
        else:
            keys = self._keys(session, [tag])
            args = [*self._append_args(sequence, tag), *tail]
            if self.wait_replicas:
                call = lambda: self._append_and_wait(keys, args)  # noqa: E731
            else:
                call = lambda: self._eval("append", keys, args)  # noqa: E731
            out = await self._call("append", call, retry=retry)
        if not out:
            raise UnknownSessionError(session)
        epoch, status = out[0].decode(), out[1]
        if status == b"lost":
            await self._sweep_lists(session, out[2:])
            raise UnknownSessionError(session)
        if status == b"collision":
            raise SequenceTagCollisionError(sequence)
        ids = [
            event_id(epoch, pos, tag, ordinal, stamp)
            for pos, ordinal, stamp in (item.split(".") for item in out[2].decode().split(","))
        ]
        if status == b"dup":
            if len(ids) != len(payloads):
                raise IdempotencyKeyReusedError(idempotency_key or "")
            return ids
        if len(out) > 3:  # sweeps or a TTL refresh due
            await self._maintain(session, out[3], out[4])
        return ids

    async def close_session(self, session: str) -> bool:
        return await self._close(session, '{"code":"closed"', ("", "always", ""))

    async def _close(
        self, session: str, tomb: str, expect: tuple[str, str, Any], tags: Sequence[str] = ()
    ) -> bool:
        """Delete the session (while ``expect`` holds: see ``close.lua``), then its lists.

        The lists of ``tags`` go in the same call; the others follow in sweeps.
        """
        nonce = secrets.token_hex(8)
        out = await self._run(
            "close",
            session,
            tags,
            [tomb, self.retention.tombstone_ttl_ms, nonce, *expect],
            retry=True,
        )
        if not int(out[0]):
            return False
        await self._sweep_lists(session, out[1:])
        return True

    async def _sweep_lists(self, session: str, tags: list[bytes]) -> None:
        """Delete the lists of a session that is gone (named by the script that removed it)."""
        names = sorted({t.decode() for t in tags})
        for start in range(0, len(names), _CHUNK):
            await self._run("sweep", session, names[start : start + _CHUNK], [], retry=True)

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
        # On a cluster too: the pipelined read follows MOVED and ASK while a
        # slot moves, and needs no transaction (see ``_snapshot``), so the
        # two reads may even be served by the two nodes of a moving slot.
        if replay and cursor is not None and cursor.tag is not None:
            fast = await self._call(
                "resolve",
                lambda: self._snapshot(session, cursor, raw_cursor, sequence),
                retry=True,
            )
            if fast is not None:
                return fast
        r = self.retention
        named_tag = sequence_tag(sequence) if sequence is not None else ""
        declared = [t for t in (cursor.tag if cursor else None, named_tag) if t]
        for _ in range(8):
            tags = sorted(set(declared))
            out = await self._run(
                "facts",
                session,
                tags,
                [
                    1 if cursor else 0,
                    cursor.position if cursor else 0,
                    cursor.tag or "" if cursor else "",
                    cursor.ordinal or 0 if cursor else 0,
                    named_tag,
                    1 if replay else 0,
                    r.max_events,
                    r.max_age_ms,
                    r.session_ttl_ms,
                    self._sweep_threshold,
                ],
                retry=True,
            )
            status = out[_SLOT["status"]]
            if status == b"gone":
                tomb = _tombstone(out[_SLOT["tombstone"]])
                evidence = unknown_session(session, raw_cursor, tomb)
                return Resumption(Verdict.UNKNOWN_SESSION, evidence, sequence)
            if status == b"need":
                declared.append(out[_SLOT["need_tag"]].decode())
                continue
            facts = _script_facts(out)
            await self._maintain(session, out[_SLOT["sweep"]], out[_SLOT["touch"]])
            judgement = judge(facts, cursor, sequence)
            failed = judgement.verdict is not Verdict.RESUMED
            torn_down = failed and replay and teardown
            if torn_down:
                tomb_json = json.dumps(
                    {"code": judgement.code, "verdict": judgement.verdict.value}
                )[:-1]
                expect = (facts.epoch, *_still_true(judgement.code, cursor, named_tag))
                if not await self._close(session, tomb_json, expect, tags):
                    continue  # the session moved since the facts were read: judge again
            evidence = evidence_for(
                session, raw_cursor, cursor, facts, judgement, torn_down=torn_down, replay=replay
            )
            events = judgement.chain.events(facts.epoch) if replay and not failed else []
            return Resumption(judgement.verdict, evidence, judgement.sequence, events)
        raise StorageError("the session kept changing while a resume was judged; try again")

    def _read(self, session: str, tag: str, named: str | None) -> _Read:
        """The fast path's read of one sequence (and the named one), built once per triple."""
        cache_key = (session, tag, named)
        read = self._reads.get(cache_key)
        if read is None:
            key = self.key_base(session)
            meta = f"{key}:m"
            fields = ["epoch", "top", "floor", "count", "nseq", f"s:{tag}"]
            named_tag = sequence_tag(named) if named is not None else tag
            if named_tag != tag:
                fields.append(f"s:{named_tag}")
            commands: list[tuple[Any, ...]] = [
                ("HMGET", meta, *fields),
                ("LRANGE", f"{key}:q:{tag}", 0, -1),  # the start changes per resume
                ("PTTL", meta),
            ]
            if self.retention.max_age_ms:
                commands += [("LINDEX", f"{key}:i", 0), ("TIME",)]
            packed = (
                _pack_one(commands[0]) + b"*4\r\n" + _pack_args(commands[1][:2]),
                b"".join(_pack_one(command) for command in commands[2:]),
            )
            if len(self._reads) > 10_000:
                self._reads.clear()
            read = self._reads[cache_key] = _Read(commands, packed)
        return read

    async def _snapshot(
        self, session: str, cursor: Cursor, raw_cursor: str, named: str | None
    ) -> Resumption | None:
        """The fast path: one pipelined read, no Lua; ``None`` when in doubt.

        Only a ``resumed`` verdict is answered here; anything else (and any
        read that shows work due: eviction, a TTL refresh) goes to the script
        path, which can also tear down.

        The ``HMGET`` and the ``LRANGE`` need no ``MULTI`` around them: between
        the two, a sequence's list only grows at its tail (events the
        bookkeeping read first does not count, so they are cut off), and any
        change at its head (a trim of evicted elements, a sweep, a lost list
        whose places are held, the sequence created again) moves what sits at
        the cursor's ordinal, which must be the cursor's own event (position
        and stamp) or the read is in doubt. So the events after it are the
        sequence's events as of the ``HMGET``, as in a snapshot.
        """
        assert cursor.tag is not None
        assert cursor.ordinal is not None
        r = self.retention
        read = self._read(session, cursor.tag, named)
        base = read.base  # other resumes may learn another one meanwhile: this read's own
        for _ in range(2):
            if cursor.ordinal < base:
                # Evicted and compacted away, or the offset is stale (the
                # sequence was created again): the script decides, and the
                # next read learns the offset anew.
                read.base = 0
                return None
            start = cursor.ordinal - base
            if self._by_hand:
                packet = read.packed[0] + _pack_args((start, -1)) + read.packed[1]
                got = await self._pipelined(packet, len(read.commands))
            else:
                lrange = (*read.commands[1][:2], start, -1)
                got = await self._pipeline([read.commands[0], lrange, *read.commands[2:]])
            for reply in got:
                if isinstance(reply, Exception):
                    raise reply
            values = got[0]
            if values[0] is None or values[5] is None:
                return None
            state = _state(values[5])
            if state.base == base:
                break
            read.base = base = state.base
        else:
            return None
        if (
            values[0].decode() != cursor.epoch
            or int(values[3]) > r.max_events
            or got[2] < r.session_ttl_ms * 0.9
        ):
            return None
        if r.max_age_ms:
            head, (seconds, micros) = got[3], got[4]
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            if head is not None and int(head.split(b",")[3]) <= now_ms - r.max_age_ms:
                return None
        states = {cursor.tag: state.public}
        if len(values) > 6 and values[6] is not None:
            other = _state(values[6])
            states[other.public.tag] = other.public
        elements = got[1]
        if not elements:
            return None
        record = _record(elements[0], state.public.name, cursor.ordinal)
        if record is None or record.position != cursor.position or record.stamp != cursor.stamp:
            return None
        facts = _Facts(
            record_at=record,
            epoch=cursor.epoch,
            top=int(values[1]),
            floor=int(values[2]),
            retained=int(values[3]),
            sequence_count=int(values[4]),
            states=states,
            chain_tag=cursor.tag,
            chain_ordinal=cursor.ordinal + 1,
            elements=elements[1:],
        )
        judgement = judge(facts, cursor, named)
        if judgement.verdict is not Verdict.RESUMED:
            return None
        evidence = evidence_for(
            session, raw_cursor, cursor, facts, judgement, torn_down=False, replay=True
        )
        return Resumption(
            judgement.verdict, evidence, judgement.sequence, judgement.chain.events(facts.epoch)
        )


# -- replies ------------------------------------------------------------------


def _not_run(reply: Any) -> bool:
    """An FCALL refused before anything ran: no such function, or not allowed."""
    if not isinstance(reply, ResponseError):
        return False
    text = str(reply).lower()
    return (
        isinstance(reply, NoPermissionError)
        or "function not found" in text
        or "unknown command" in text
    )


async def _reply(conn: Any) -> Any:
    """One reply, with no timer of its own (the caller's covers it); an error reply as a value.

    (After an error reply the connection is still in step.)
    """
    try:
        return await conn.read_response(timeout=math.inf)
    except ResponseError as exc:
        return exc


async def _send(conn: Any, packet: bytes, *, crowded: bool) -> None:
    """Write a packet on a connection of redis-py's own classes.

    redis-py's ``send_packed_command`` runs every write under
    ``asyncio.wait_for``, which on Python 3.11 creates a task per call: about
    15 µs, more than a short resume's own work. A packet the socket takes at
    once needs no timer, so only a write that has to wait (the socket's buffer
    is full) is timed, under the socket timeout as redis-py would. A connection
    not yet open goes through redis-py, which opens it.

    When the write happens is chosen for Redis's sake as much as ours:

    * alone, the write goes out at once and the task then yields to the event
      loop once: the reply takes longer than one loop iteration, and a read
      started at once would find nothing, put the loop to sleep and make the
      reply wake it, which costs both sides more than the yield;
    * ``crowded`` (other calls of this backend in flight), the task yields
      first, so that the writes of all the calls that are ready go out
      together in the next loop iteration and Redis reads them in one wake-up
      instead of one each. A reconnect storm is exactly that case.

    Measured on loopback against writing at once in both cases: alone, the
    same; 32 callers, half the Redis CPU per resume of 10 and about 20% less
    wall clock.
    """
    writer = getattr(conn, "_writer", None)
    if writer is None or not conn.is_connected:
        await conn.send_packed_command(packet, check_health=False)
        return
    try:
        if crowded:
            await asyncio.sleep(0)
        writer.write(packet)
        if writer.transport.get_write_buffer_size():
            await asyncio.wait_for(writer.drain(), conn.socket_timeout)
        elif not crowded:
            await asyncio.sleep(0)
    except TimeoutError:
        raise RedisTimeoutError("timeout writing to socket") from None
    except OSError as exc:
        raise RedisConnectionError(f"error while writing to socket: {exc}") from exc


async def _drop(conn: Any) -> None:
    """Drop a connection that failed or is out of step, and what it still holds to send.

    A plain close would still send the rest of a packet whose write timed
    out, and Redis would run the command after the caller was told it
    failed; cut off, the command never completes and is never run.
    """
    writer = getattr(conn, "_writer", None)
    if writer is not None:
        writer.transport.abort()
    await conn.disconnect(nowait=True)


def _pack_one(command: tuple[Any, ...]) -> bytes:
    """One command in the Redis protocol (RESP)."""
    return b"*%d\r\n" % len(command) + _pack_args(command)


def _pack_args(args: Sequence[Any]) -> bytes:
    """Arguments in the Redis protocol, without the count that heads a command."""
    out = []
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _still_true(code: str, cursor: Cursor | None, named_tag: str) -> tuple[str, Any]:
    """The condition under which a failed verdict still holds (``close.lua``).

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


def _durability_options(url: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Take ``wait_replicas``/``wait_timeout`` out of the URL query and the options."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    found = {k: v for k, v in query if k in ("wait_replicas", "wait_timeout")}
    rest = [(k, v) for k, v in query if k not in found]
    out: dict[str, Any] = {}
    try:
        if "wait_replicas" in found:
            out["wait_replicas"] = int(found["wait_replicas"])
        if "wait_timeout" in found:
            out["wait_timeout"] = float(found["wait_timeout"])
    except ValueError as exc:
        raise UnsupportedURLError(f"bad durability option in {url!r}: {exc}") from exc
    for name in ("wait_replicas", "wait_timeout"):
        if name in options:
            out[name] = options.pop(name)
    return urlunsplit(parts._replace(query=urlencode(rest))), out


@dataclass(slots=True)
class _Read:
    """A resume's pipelined read: its commands, and packed around the ``LRANGE`` start."""

    commands: list[tuple[Any, ...]]
    packed: tuple[bytes, bytes]
    base: int = 0  # the list offset seen last (it changes only when a list is compacted)


@dataclass(frozen=True, slots=True)
class _StoredState:
    public: SequenceState
    base: int
    stamp: int  # the high-water event's

    def newest_evicted(self, element: bytes | None) -> Record | None:
        """The sequence's newest evicted event: ``element`` (ordinal ``first - 1``),
        or, when every event is evicted, its high-water event (the state names it)."""
        state = self.public
        if element is not None:
            return _record(element, state.name, state.first_ordinal - 1)
        if state.retained == 0 and state.next_ordinal > 0:
            return Record(state.high_water, state.name, state.next_ordinal - 1, None, self.stamp)
        return None


def _state(raw: bytes) -> _StoredState:
    """``high_water,stamp,floor,first,next,base,priming,name`` (the name may hold commas)."""
    hw, stamp, floor, first, nxt, base, _priming, name = raw.split(b",", 7)
    text = name.decode("utf-8")
    return _StoredState(
        SequenceState(text, sequence_tag(text), int(hw), int(floor), int(first), int(nxt)),
        int(base),
        int(stamp),
    )


def _record(element: bytes, sequence: str, ordinal: int) -> Record | None:
    """``<position>,<stamp>:<payload>``, ``<position>,<stamp>`` (priming), or empty (lost)."""
    head, colon, payload = element.partition(b":")
    if not _HEAD_RE.fullmatch(head):
        return None
    position, _, stamp = head.partition(b",")
    return Record(int(position), sequence, ordinal, payload if colon else None, int(stamp))


def _stored(elements: list[bytes]) -> Stored:
    """Decode list elements into parallel arrays: the replay's hot loop.

    Written as ``map`` over C functions and one pattern match over all the
    heads, with no Python code run per element, and the stamps kept as text:
    they only go into event ids. A list with any element that is not
    ``<position>,<stamp>[:<payload>]`` (a lost one is empty) takes the slow
    path, element by element.
    """
    parts = list(map(bytes.partition, elements, repeat(b":")))
    heads = b";".join(map(_HEAD, parts))
    positions: list[int | None]
    # The pattern proves every ;-separated piece a head, the count that no
    # head holds a ";" of its own: together, every element is well formed.
    if heads.count(b";") == len(parts) - 1 and _HEADS_RE.fullmatch(heads):
        numbers = heads.decode().replace(";", ",").split(",")
        positions = list(map(int, numbers[0::2]))
        stamps = numbers[1::2]
    else:  # a lost element (empty) or a damaged one: mark it, the rules see a hole
        positions, stamps = [], []
        for head, _, _ in parts:
            ok = _HEAD_RE.fullmatch(head)
            position, _, stamp = head.partition(b",")
            positions.append(int(position) if ok else None)
            stamps.append(stamp.decode() if ok else "")
    if b"" in map(_SEPARATOR, parts):  # priming events carry no payload
        return Stored(positions, [body if sep else None for _, sep, body in parts], stamps)
    return Stored(positions, list(map(_BODY, parts)), stamps)


#: A position or a stamp as the scripts write them, and as cursors spell them
#: (no sign, no leading zero); possessive, which makes the match of a whole
#: list's heads (about 5 us for 100) a fifth cheaper.
_NUMBER = rb"(?:0|[1-9][0-9]*+)"
_HEAD_RE = re.compile(_NUMBER + b"," + _NUMBER)
_HEADS_RE = re.compile(_NUMBER + b"," + _NUMBER + b"(?:;" + _NUMBER + b"," + _NUMBER + b")*+")
_HEAD, _SEPARATOR, _BODY = (operator.itemgetter(i) for i in range(3))


@dataclass(slots=True)
class _Facts:
    """Facts read from Redis (``replaystore._rules.Facts``)."""

    epoch: str
    top: int
    floor: int
    retained: int
    sequence_count: int
    states: dict[str, SequenceState]
    chain_tag: str | None
    chain_ordinal: int
    elements: list[bytes]
    record_at: Record | None = None
    evicted: Record | None = None  # the chain sequence's newest evicted event, when read

    def sequence(self, name: str) -> SequenceState | None:
        state = self.states.get(sequence_tag(name))
        return state if state is not None and state.name == name else None

    def only_sequence(self) -> str | None:
        state = self.states.get(self.chain_tag or "")
        return state.name if state is not None and self.sequence_count == 1 else None

    def record(self, position: int) -> Record | None:
        at = self.record_at
        return at if at is not None and at.position == position else None

    def last_evicted(self, tag: str) -> Record | None:
        return self.evicted if tag == self.chain_tag else None

    def events_from(self, sequence: str, ordinal: int) -> Stored:
        state = self.sequence(sequence)
        if state is None or state.tag != self.chain_tag or ordinal < self.chain_ordinal:
            return Stored([], [], [])
        skip = ordinal - self.chain_ordinal
        return _stored(self.elements[skip:] if skip else self.elements)


def _script_facts(out: list[Any]) -> _Facts:
    """Facts from ``facts.lua``'s reply."""

    def slot(name: str) -> Any:
        return out[_SLOT[name]]

    states: dict[str, SequenceState] = {}
    chain: _StoredState | None = None
    for raw in (slot("named_state"), slot("chain_state")):
        if raw:
            chain = _state(raw)
            states[chain.public.tag] = chain.public
    chain_tag = slot("chain_tag").decode() if slot("chain_tag") else None
    evicted = None
    if chain is not None and chain_tag == chain.public.tag:
        evicted = chain.newest_evicted(slot("evicted_element") or None)
    record_at = None
    if slot("record_tag"):
        owner = states.get(slot("record_tag").decode())
        record_at = _record(
            slot("record_element"), owner.name if owner else "", int(slot("record_ordinal"))
        )
    return _Facts(
        epoch=slot("epoch").decode(),
        top=int(slot("top")),
        floor=int(slot("floor")),
        retained=int(slot("count")),
        sequence_count=int(slot("nseq")),
        states=states,
        chain_tag=chain_tag,
        chain_ordinal=int(slot("chain_ordinal") or 0),
        elements=list(out[len(FACT_SLOTS) :]),
        record_at=record_at,
        evicted=evicted,
    )


def _tombstone(raw: bytes | None) -> Tombstone | None:
    if not raw:
        return None
    data = json.loads(raw)
    verdict = data.get("verdict")
    return Tombstone(
        reason=reason_text(data.get("code", "")),
        at=data.get("at", 0) / 1000,
        verdict=Verdict(verdict) if verdict else None,
    )


def _info(session: str, meta: list[Any], states: list[bytes]) -> SessionInfo:
    parsed = sorted((_state(raw).public for raw in states), key=lambda s: s.floor)
    return SessionInfo(
        session=session,
        epoch=meta[0].decode(),
        floor=int(meta[2]),
        high_water=int(meta[1]),
        retained=int(meta[3]),
        sequences={s.name: s.info() for s in parsed},
    )

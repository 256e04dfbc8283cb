"""``redis://``, ``rediss://``, ``redis+unix://``, ``redis+cluster://``, ``redis+sentinel://``.

Each operation is exactly one round trip: one Lua script (``backends/lua/``),
called with EVALSHA and re-sent with EVAL when the server's script cache was
emptied (restart, failover, SCRIPT FLUSH). Every key a script touches belongs
to one session and carries the session's hash tag, so on Redis Cluster each
script runs on the one node that owns the session. The layout is drawn in
``docs/data-layout.md``.

URL forms (query ``prefix=`` sets the key prefix, default ``replaystore:``)::

    redis://[[user]:password@]host[:port][/db][?prefix=app1:]
    rediss://...                                  (TLS; ssl_* query options as in redis-py)
    redis+unix:///path/to/redis.sock[?db=0]
    redis+cluster://[[user]:password@]host:port[,host:port...][?prefix=...]
    rediss+cluster://...                          (TLS)
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]

Standalone connections come from a blocking pool (``max_connections``, default
128; ``pool_timeout`` seconds to wait for a free one, default 10).

``from_url(..., client=...)`` takes a ready ``redis.asyncio`` client instead
(fakeredis in tests, or a client the application already configured); it must
not decode responses.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import msgpack
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from .._rules import reason
from ..cursor import Cursor, new_epoch
from ..errors import StorageError, UnknownSessionError, UnsupportedURLError
from ..info import SequenceInfo, SessionInfo
from ..retention import Retention
from ..verdicts import Event, Evidence, Resumption, Tombstone, Verdict
from . import register_backend
from ._redis_client import build_client
from .base import Backend

__all__ = ["RedisBackend"]

DEFAULT_PREFIX = "replaystore:"


@dataclass(frozen=True, slots=True)
class _Script:
    """One Lua script: the shared helpers followed by the operation's own file."""

    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> _Script:
        folder = resources.files("replaystore.backends") / "lua"
        source = (folder / "_lib.lua").read_text() + "\n" + (folder / f"{name}.lua").read_text()
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


_SCRIPTS = {name: _Script.load(name) for name in ("open", "append", "resolve", "info", "close")}


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
    ) -> None:
        super().__init__(retention)
        if "{" in prefix or "}" in prefix:
            raise UnsupportedURLError("the key prefix must not contain '{' or '}' (hash tags)")
        self.client = client
        self.prefix = prefix
        self._owns_client = owns_client

    @classmethod
    def from_url(
        cls, url: str, retention: Retention, *, client: Any = None, **options: Any
    ) -> RedisBackend:
        client, prefix, owns = build_client(url, client=client, **options)
        return cls(retention, client, prefix=prefix or DEFAULT_PREFIX, owns_client=owns)

    def _keys(self, session: str) -> list[str]:
        """The session's four key names, all with the hash tag ``{<session>}``.

        Redis Cluster hashes the text between the first ``{`` and the next
        ``}``; a session id containing braces would cut that tag short (or
        empty it, spreading the keys over several slots), so such ids are
        written as hex behind a space, which no session id can contain.
        """
        tag = session if "{" not in session and "}" not in session else " " + session.encode().hex()
        base = f"{self.prefix}{{{tag}}}"
        return [f"{base}:m", f"{base}:e", f"{base}:n", f"{base}:t"]

    async def _run(self, name: str, session: str, *args: Any) -> Any:
        script = _SCRIPTS[name]
        keys = self._keys(session)
        try:
            try:
                return await self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                # The script cache is volatile; EVAL runs and re-caches it.
                return await self.client.eval(script.source, len(keys), *keys, *args)
        except (RedisError, RedisClusterException) as exc:
            # RedisClusterException (no reachable node, slot not covered, keys
            # in several slots) is not a RedisError.
            raise StorageError(f"{name} failed on redis: {exc}") from exc

    async def connect(self) -> None:
        try:
            if isinstance(self.client, RedisCluster):
                await self.client.initialize()
            else:
                await self.client.ping()
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

    # -- the contract ------------------------------------------------------

    async def open_session(self, session: str) -> SessionInfo:
        r = self.retention
        flat = await self._run(
            "open", session, new_epoch(), r.session_ttl_ms, r.max_events, r.max_age_ms
        )
        return _info(session, flat)

    async def session_info(self, session: str) -> SessionInfo | None:
        r = self.retention
        flat = await self._run("info", session, r.max_events, r.max_age_ms)
        return None if flat is None else _info(session, flat)

    async def append(
        self, session: str, sequence: str, payloads: Sequence[bytes | None]
    ) -> tuple[str, int]:
        r = self.retention
        packed = [msgpack.packb(p) for p in payloads]
        out = await self._run(
            "append",
            session,
            sequence.encode("utf-8"),
            r.max_events,
            r.max_age_ms,
            r.session_ttl_ms,
            *packed,
        )
        if out is None:
            raise UnknownSessionError(session)
        return out[0].decode(), int(out[1])

    async def close_session(self, session: str) -> bool:
        tomb = json.dumps({"code": "closed", "at": round(time.time() * 1000)})
        return bool(await self._run("close", session, tomb, self.retention.tombstone_ttl_ms))

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
        r = self.retention
        out = await self._run(
            "resolve",
            session,
            1 if cursor else 0,
            cursor.epoch if cursor else "",
            cursor.position if cursor else 0,
            0 if sequence is None else 1,
            (sequence or "").encode("utf-8"),
            1 if replay else 0,
            1 if teardown else 0,
            r.max_events,
            r.max_age_ms,
            r.session_ttl_ms,
            r.tombstone_ttl_ms,
        )
        return _resumption(session, cursor, raw_cursor, sequence, out)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8")


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _resumption(
    session: str, cursor: Cursor | None, raw: str, named: str | None, out: list[Any]
) -> Resumption:
    verdict = Verdict(out[0].decode())
    code = out[1].decode()
    sequence = _text(out[2])
    if verdict is Verdict.UNKNOWN_SESSION:
        tomb = _tombstone(out[12])
        if tomb is not None:
            code = "closed" if tomb.verdict is None else "torn_down"
        evidence = Evidence(session=session, reason=reason(code), cursor=raw[:64], tombstone=tomb)
        return Resumption(verdict, evidence, named)
    epoch = out[4].decode()
    evidence = Evidence(
        session=session,
        reason=reason(code),
        cursor=raw[:64],
        cursor_epoch=cursor.epoch if cursor else None,
        cursor_position=cursor.position if cursor else None,
        epoch=epoch,
        floor=int(out[6]),
        high_water=int(out[5]),
        retained=int(out[7]),
        sequence=sequence,
        sequence_floor=_int(out[9]),
        sequence_high_water=_int(out[10]),
        cursor_sequence=_text(out[3]),
        sequence_count=int(out[8]),
        replayed=(len(out) - 13) // 2 if verdict is Verdict.RESUMED else None,
        torn_down=bool(out[11]),
    )
    events = []
    assert sequence is not None or len(out) == 13
    for i in range(13, len(out), 2):
        position = int(out[i])
        payload = cast("bytes | None", msgpack.unpackb(out[i + 1]))
        events.append(Event(f"{epoch}-{position}", cast(str, sequence), position, payload))
    return Resumption(verdict, evidence, sequence, events)


def _tombstone(raw: bytes | None) -> Tombstone | None:
    if raw is None:
        return None
    data = json.loads(raw)
    verdict = data.get("verdict")
    return Tombstone(
        reason=reason(data.get("code", "")),
        at=data.get("at", 0) / 1000,
        verdict=Verdict(verdict) if verdict else None,
    )


def _info(session: str, flat: list[Any]) -> SessionInfo:
    sequences = {
        flat[i].decode("utf-8"): SequenceInfo(int(flat[i + 1]), int(flat[i + 2]), int(flat[i + 3]))
        for i in range(4, len(flat), 4)
    }
    return SessionInfo(
        session=session,
        epoch=flat[0].decode(),
        floor=int(flat[2]),
        high_water=int(flat[1]),
        retained=int(flat[3]),
        sequences=dict(sorted(sequences.items(), key=lambda kv: kv[1].floor)),
    )

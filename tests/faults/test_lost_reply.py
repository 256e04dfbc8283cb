"""A lost reply on append: Redis executed it, the caller never heard back.

A ``TcpProxy`` between the client and Redis forwards the append, waits for
the first byte of Redis's reply (so the script has run) and cuts both sides.
With an idempotency key the caller's retry returns the first attempt's ids
and stores nothing twice; without one the caller gets ``StorageError`` (no
client or backend re-sends it behind its back), and a resume shows the one
event that was stored. On a cluster, every node sits behind its own proxy
(``address_remap``), so the redirections and the lost reply are real too.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from replaystore import ReplayBuffer, StorageError, Verdict
from replaystore.backends.redis.scripts import SCRIPTS
from replaystore.testing import TcpProxy
from tests.faults.conftest import at, behind_proxies
from tests.plugins.servers import RealServers

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]


def _require_idempotency_keys() -> None:
    for method in (ReplayBuffer.append, ReplayBuffer.append_many):
        if "idempotency_key" not in inspect.signature(method).parameters:
            pytest.fail(f"ReplayBuffer.{method.__name__}(..., idempotency_key=...) does not exist")


@pytest.fixture(params=["standalone", "cluster"])
def proxied(
    request: pytest.FixtureRequest, real_servers: RealServers
) -> Iterator[tuple[str, dict[str, Any], list[TcpProxy]]]:
    """(url, options, proxies): a buffer built from these reaches Redis only through proxies."""
    with ExitStack() as stack:
        if request.param == "standalone":
            handle = real_servers.shared("redis")
            proxy = stack.enter_context(TcpProxy([("127.0.0.1", handle.ports[0])]))
            yield proxy.url(), {}, [proxy]
            return
        with behind_proxies(real_servers.shared("cluster")) as proxied:
            yield proxied


async def _cache_scripts(buffer: ReplayBuffer) -> None:
    """Every script in every master's cache (a cluster runs them by ``EVALSHA``): otherwise
    the armed append's first reply could be a ``NOSCRIPT`` refusal, cut before it ever ran."""
    client: Any = buffer.backend.client  # type: ignore[attr-defined]
    for script in SCRIPTS.values():
        await client.script_load(script.source)


def _arm(proxies: list[TcpProxy], needle: bytes) -> None:
    for proxy in proxies:
        proxy.drop_reply_after(needle)


def _drops(proxies: list[TcpProxy]) -> int:
    return sum(proxy.drops for proxy in proxies)


async def _replay_after(buf: ReplayBuffer, session: str, cursor: str) -> list[tuple[str, bytes]]:
    res = await buf.resolve_and_replay(session, cursor)
    assert res.verdict is Verdict.RESUMED, res
    return [(e.event_id, e.payload or b"") for e in res.events]


async def test_without_a_key_the_caller_gets_storage_error_and_no_duplicate(
    proxied: tuple[str, dict[str, Any], list[TcpProxy]], prefix: str
) -> None:
    url, options, proxies = proxied
    async with ReplayBuffer.from_url(url, prefix=prefix, **options) as buffer:
        await _without_a_key(buffer, proxies)


async def _without_a_key(buffer: ReplayBuffer, proxies: list[TcpProxy]) -> None:
    await buffer.open_session("s")
    first = await buffer.append("s", "q", b"before")
    await _cache_scripts(buffer)

    _arm(proxies, b"lost-without-key")
    with pytest.raises(StorageError):
        await buffer.append("s", "q", b"lost-without-key")
    assert _drops(proxies) == 1, "the fault did not fire"

    # Redis ran the append once: a resume shows it, once, and nothing else.
    epoch = at(first)[0]
    replayed = await _replay_after(buffer, "s", first)
    assert [(at(eid), payload) for eid, payload in replayed] == [((epoch, 2), b"lost-without-key")]
    assert at(await buffer.append("s", "q", b"after")) == (epoch, 3)


async def test_with_a_key_the_retry_returns_the_stored_event(
    proxied: tuple[str, dict[str, Any], list[TcpProxy]], prefix: str
) -> None:
    _require_idempotency_keys()
    url, options, proxies = proxied
    async with ReplayBuffer.from_url(url, prefix=prefix, **options) as buffer:
        await _with_a_key(buffer, proxies)


async def _with_a_key(buffer: ReplayBuffer, proxies: list[TcpProxy]) -> None:
    append: Any = buffer.append
    append_many: Any = buffer.append_many
    await buffer.open_session("s")
    first = await buffer.append("s", "q", b"before")
    await _cache_scripts(buffer)
    epoch = at(first)[0]

    _arm(proxies, b"lost-with-key")
    try:
        eid = await append("s", "q", b"lost-with-key", idempotency_key="request-1")
    except StorageError:  # the backend did not retry itself: the caller does
        eid = await append("s", "q", b"lost-with-key", idempotency_key="request-1")
    assert _drops(proxies) == 1, "the fault did not fire"
    assert at(eid) == (epoch, 2)
    assert await _replay_after(buffer, "s", first) == [(eid, b"lost-with-key")]
    # The same key again, later: the same id, still one event.
    assert await append("s", "q", b"lost-with-key", idempotency_key="request-1") == eid

    _arm(proxies, b"lost-batch")
    batch = [b"lost-batch-1", None, b"lost-batch-3"]
    try:
        ids = await append_many("s", "q", batch, idempotency_key="request-2")
    except StorageError:
        ids = await append_many("s", "q", batch, idempotency_key="request-2")
    assert _drops(proxies) == 2, "the fault did not fire"
    assert [at(i) for i in ids] == [(epoch, 3), (epoch, 4), (epoch, 5)]
    replayed = await _replay_after(buffer, "s", eid)
    assert replayed == [(ids[0], b"lost-batch-1"), (ids[1], b""), (ids[2], b"lost-batch-3")]

    # A different key is a different request.
    other = await append("s", "q", b"lost-with-key", idempotency_key="request-3")
    assert at(other) == (epoch, 6)


async def test_appends_sharing_a_packet_whose_replies_are_lost(
    real_servers: RealServers, prefix: str
) -> None:
    """Ten appends to ten sessions share one packet, and its replies are cut after Redis ran
    it: with keys, each is retried once and stored once; without, the callers of that
    packet get ``StorageError`` and nothing is sent twice. Every session holds its event once.
    """
    handle = real_servers.shared("redis")
    with TcpProxy([("127.0.0.1", handle.ports[0])]) as proxy:
        async with ReplayBuffer.from_url(proxy.url(), prefix=prefix) as buffer:
            backend: Any = buffer.backend
            sessions = [f"p{i}" for i in range(10)]
            firsts = {}
            for s in sessions:
                await buffer.open_session(s)
                firsts[s] = await buffer.append(s, "q", b"before")

            async def together(payload: str, keyed: bool) -> list[Any]:
                busy = await backend._wire._pool.take()  # a call in flight: the appends gather
                try:
                    return await asyncio.gather(
                        *(
                            buffer.append(
                                s,
                                "q",
                                f"{payload}-{s}".encode(),
                                idempotency_key=f"{payload}-{s}" if keyed else None,
                            )
                            for s in sessions
                        ),
                        return_exceptions=True,
                    )
                finally:
                    await backend._wire._pool.give(busy)

            _arm([proxy], b"keyed-p3")
            ids = await together("keyed", keyed=True)
            assert proxy.drops == 1, "the fault did not fire"
            assert all(isinstance(i, str) for i in ids), ids  # each retried once by the backend
            for s, eid in zip(sessions, ids, strict=True):
                assert await _replay_after(buffer, s, firsts[s]) == [(eid, f"keyed-{s}".encode())]

            _arm([proxy], b"keyless-p3")
            got = await together("keyless", keyed=False)
            assert proxy.drops == 2, "the fault did not fire"
            lost = [g for g in got if isinstance(g, BaseException)]
            assert len(lost) == len(sessions), got  # one packet: every caller of it
            assert all(isinstance(g, StorageError) for g in lost), got
            for s, keyed_id in zip(sessions, ids, strict=True):
                replayed = await _replay_after(buffer, s, keyed_id)
                assert [p for _, p in replayed] == [f"keyless-{s}".encode()]  # once, not twice

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

import inspect
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from replaystore import ReplayBuffer, StorageError, Verdict
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
    first = await buffer.append("s", "q", b"before")  # the script is cached from here on

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

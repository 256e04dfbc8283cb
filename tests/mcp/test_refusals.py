"""A Redis that refuses writes (``maxmemory`` reached under ``noeviction``), over HTTP.

Two example-server replicas on a Redis of this module alone. Once Redis is
full, every MCP path answers ``503`` with ``Retry-After`` naming what Redis
said (or ``200`` for a read that still works), never ``500``, never a cut
response; ``/healthz`` says ``503`` too. Once memory is freed, the same
sessions go on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
import redis

from replaystore.cursor import Cursor
from replaystore.errors import StorageError
from replaystore.testing.mcp import initialize_message
from replaystore.testing.servers import ServerHandle
from replaystore.testing.sse import sse_events
from tests.mcp._support import (
    RawSession,
    ServerProcess,
    progress_of,
    replica_pair,
)
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def full_redis(real_servers: RealServers) -> Iterator[ServerHandle]:
    handle = real_servers.own("redis")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def replicas(
    full_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    logs = tmp_path_factory.mktemp("refusals")
    url = f"{full_redis.url}?prefix=rf:"
    with replica_pair(url, logs) as started:
        yield started


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as client:
        yield client


def _admin(handle: ServerHandle) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=handle.ports[0])


def _refused(response: httpx.Response, why: str) -> None:
    """503, Retry-After, and the JSON-RPC error saying what the store said."""
    assert response.status_code == 503, (response.status_code, response.text)
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert why in error["message"], error
    assert error["data"]["reason"] == "storage_error"


async def test_a_full_redis_is_503_on_every_path_and_the_sessions_go_on(
    replicas: list[ServerProcess], full_redis: ServerHandle, http: httpx.AsyncClient
) -> None:
    a, b = replicas
    session = await RawSession(http, a.url).initialize()
    doomed = await RawSession(http, a.url).initialize()
    _, body = session.call("countdown", {"n": 3, "interval_ms": 0}, token="t")
    async with session.post(body) as response:
        events = [event async for event in sse_events(response)]
    cursor = next(e.id for e in events if e.priming and e.id)
    admin = _admin(full_redis)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # every write Redis checks is refused from now on
    out_of_memory = "out of memory"
    try:
        with anyio.fail_after(20):
            fresh = RawSession(http, a.url).headers()
            _refused(
                await http.post(a.url, json=initialize_message(), headers=fresh), out_of_memory
            )
            # (And one sent on a session: refused alike, not a 200 cut short.)
            _refused(
                await http.post(a.url, json=initialize_message(), headers=session.headers()),
                out_of_memory,
            )
            _, ping = session.request("ping", {})
            _refused(await http.post(a.url, json=ping, headers=session.headers()), out_of_memory)
            _, call = session.call("countdown", {"n": 2, "interval_ms": 0})
            _refused(await http.post(a.url, json=call, headers=session.headers()), out_of_memory)
            # Another replica adopts the session from the store: refused alike.
            elsewhere = RawSession(http, b.url, session.session_id, next_id=100)
            _, ping = elsewhere.request("ping", {})
            _refused(await http.post(b.url, json=ping, headers=session.headers()), out_of_memory)
            # A resume reads: exact, or refused; never a 500.
            async with session.get(cursor) as response:
                assert response.status_code in (200, 503), response.status_code
                if response.status_code == 200:
                    replayed = [e.message async for e in sse_events(response) if e.message]
                    assert replayed[-1]["result"]["content"][0]["text"] == "done 3"
                else:
                    await response.aread()
                    _refused(response, out_of_memory)
            # The standalone GET stream: refused (its mark cannot be kept).
            async with session.get() as response:
                await response.aread()
                _refused(response, out_of_memory)
            headers = doomed.headers()
            _refused(await http.delete(a.url, headers=headers), out_of_memory)
            for server in (a, b):
                health = await http.get(f"{server.base}/healthz")
                assert health.status_code == 503 and out_of_memory in health.text, health.text
    finally:
        admin.config_set("maxmemory", 0)
    # Memory freed: the same sessions go on, on either replica; nothing was cut.
    assert await session.ping_status() == 200
    assert await doomed.ping_status() == 200  # its DELETE was refused: it lives on
    assert await session.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"
    for server in (a, b):
        assert (await http.get(f"{server.base}/healthz")).status_code == 200
        log = server.log_tail(400)
        assert "Traceback" not in log and "without completing response" not in log, log


async def test_a_refusal_inside_an_open_stream_answers_the_request_in_it(
    replicas: list[ServerProcess], full_redis: ServerHandle, http: httpx.AsyncClient
) -> None:
    """Redis refuses while a tool's progress streams: the request's error ends the stream.

    The error is the request's response, in the stream, naming what Redis
    said; the stream ends cleanly (no cut chunk), the session lives on, and a
    resume from the last event id the client holds is exact: the events after
    it (stored once Redis takes writes again) with no gap, ending with the
    request's answer.
    """
    a, b = replicas
    session = await RawSession(http, a.url).initialize()
    request_id, body = session.call("countdown", {"n": 400, "interval_ms": 10}, token="t")
    admin = _admin(full_redis)
    admin.config_set("maxmemory-policy", "noeviction")
    seen = []
    try:
        with anyio.fail_after(30):
            async with session.post(body) as response:
                assert response.status_code == 200
                async for event in sse_events(response):
                    seen.append(event)
                    if progress_of(event) == 3:
                        admin.config_set("maxmemory", 1)  # refused from the next write on
    finally:
        admin.config_set("maxmemory", 0)
    last = seen[-1].message
    assert last is not None and last.get("id") == request_id, (seen[-3:], a.log_tail(60))
    assert "out of memory" in last["error"]["message"], last
    assert last["error"]["data"]["reason"] == "storage_error", last
    assert seen[-1].id is None  # not stored: nothing to resume after it
    progress = [p for p in map(progress_of, seen) if p is not None]
    assert progress == [float(i) for i in range(1, len(progress) + 1)], progress
    held = [e.id for e in seen if e.id]
    # The session goes on, on either replica, and the stream resumes exactly.
    assert await session.ping_status() == 200
    resumed = RawSession(http, b.url, session.session_id, next_id=100)
    with anyio.fail_after(30):
        async with resumed.get(held[-1]) as response:
            assert response.status_code == 200, await response.aread()
            replayed = [e async for e in sse_events(response)]
    # Exact: the stream's events after the client's last id, each once, none skipped.
    ordinals = [_ordinal(e.id) for e in replayed if e.id]
    assert ordinals == list(range(_ordinal(held[-1]) + 1, ordinals[-1] + 1)), replayed
    answer = replayed[-1].message
    assert answer is not None and answer.get("id") == request_id, replayed
    assert "out of memory" in answer["error"]["message"], answer  # stored once Redis took it
    again = [p for p in map(progress_of, replayed) if p is not None]
    assert not again or again[0] > progress[-1], (again, progress)
    assert await session.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"
    for server in (a, b):
        log = server.log_tail(400)
        assert "Traceback" not in log and "without completing response" not in log, log
        # the log says what happened: the session lives on in the store
        assert "continuity can no longer be proven" not in log, log
    assert "the session stays in the store" in a.log_tail(400) + b.log_tail(400)


def _ordinal(event_id: str) -> int:
    """The place of an event in its stream (1, 2, ...)."""
    ordinal = Cursor.parse(event_id).ordinal
    assert ordinal is not None
    return ordinal


# ---------------------------------------------------------------- read_within


async def test_a_read_past_its_deadline_is_given_up_as_bounded_gives_it_up() -> None:
    """``read_within`` answers a hung read with the same StorageError as ``bounded``, and
    the task goes on uncancelled; a read in time is left alone."""
    import asyncio

    from replaystore.mcp.refusals import bounded, read_within

    async def hang() -> None:
        await asyncio.sleep(30)

    texts = []
    for bound in (bounded, read_within):
        started = asyncio.get_running_loop().time()
        with pytest.raises(StorageError) as caught, bound(0.2):
            await hang()
        texts.append(str(caught.value))
        took = asyncio.get_running_loop().time() - started
        assert 0.2 <= took < 5  # given up, not waited out
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0)  # no cancellation left pending for later
    assert texts[0] == texts[1] == "the replay store did not answer within 0.2 s"
    with read_within(5):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # the timer found nothing to give up


async def test_a_cancellation_from_outside_passes_through_a_read_within() -> None:
    """A request cancelled while it reads is cancelled, not told the store was slow."""
    import asyncio

    from replaystore.mcp.refusals import read_within

    async def read(bound: float) -> None:
        with read_within(bound):
            await asyncio.sleep(30)

    task = asyncio.ensure_future(read(5.0))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_refusal_being_tried_again_is_what_read_within_reports() -> None:
    """As with ``bounded``: the deadline that ends a retried refusal reports the refusal."""
    import asyncio

    from replaystore.mcp.refusals import note_refusal, read_within

    async def refused_then_hung() -> None:
        with read_within(0.1):
            note_refusal(StorageError("OOM command not allowed", kind="oom"))
            await asyncio.sleep(30)

    with pytest.raises(StorageError) as caught:
        await refused_then_hung()
    assert caught.value.kind == "oom"
    assert "OOM" in str(caught.value)

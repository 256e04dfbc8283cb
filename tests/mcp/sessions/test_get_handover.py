"""A plain GET that replaces the previous one delivers nothing twice, over real HTTP.

A plain GET (no ``Last-Event-ID``) resumes the standalone stream from the
last event handed to a GET connection. Checked on one replica (memory:// and
Redis) with the previous GET closed a moment before, and still open while
messages flow, and on two replicas sharing one Redis with the previous GET
still open on the other one. The mark is saved with a write that never moves
it back, checked here on both registries.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
import redis.asyncio

from replaystore import ReplayBuffer
from replaystore.backends.memory.registry import MemoryRegistry
from replaystore.backends.redis import RedisBackend
from replaystore.backends.session_registry import Registry
from replaystore.testing.servers import ServerHandle
from replaystore.testing.sse import SSE
from tests.mcp._support import RawSession, ServerProcess, sse_events

pytestmark = pytest.mark.anyio

#: Close-and-reopen rounds: each one raced the previous GET's end before.
ROUNDS = 12


def log_texts(events: list[SSE]) -> list[str]:
    return [
        str(e.message["params"]["data"])
        for e in events
        if e.message and e.message.get("method") == "notifications/message"
    ]


async def until_priming(events: AsyncIterator[SSE]) -> list[SSE]:
    """The events up to and with the first priming event (the end of a GET's replay)."""
    got: list[SSE] = []
    with anyio.fail_after(10):
        async for event in events:
            got.append(event)
            if event.priming:
                return got
    raise AssertionError(f"the GET ended before its priming event: {got!r}")


async def test_plain_get_reopened_at_once_replays_nothing_twice(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    session = await RawSession(http, sdk.url).initialize()
    for round_ in range(ROUNDS):
        assert await session.run_tool("broadcast", {"n": 2}) == "sent 2"
        async with session.get() as response:
            assert response.status_code == 200
            got = await until_priming(sse_events(response))
        assert log_texts(got) == ["broadcast 1/2", "broadcast 2/2"], f"round {round_}"
        # Closed, and opened again at once: the previous GET delivered everything.
        async with session.get() as response:
            assert response.status_code == 200
            again = await until_priming(sse_events(response))
        assert log_texts(again) == [], f"delivered twice in round {round_}"


async def test_plain_get_taking_over_a_live_get_delivers_each_message_once(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    """The new GET arrives while the old one still delivers: together, each message once."""
    session = await RawSession(http, sdk.url).initialize()
    total = 150
    first: list[SSE] = []
    second: list[SSE] = []
    async with session.get() as response:
        events = sse_events(response)
        await until_priming(events)

        flowing = anyio.Event()

        async def read_first() -> None:
            async for event in events:  # until the takeover ends it
                first.append(event)
                if len(log_texts(first)) >= 10:
                    flowing.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_first)
            tasks.start_soon(session.run_tool, "broadcast", {"n": total})
            with anyio.fail_after(10):
                await flowing.wait()
            async with session.get() as taking_over:
                assert taking_over.status_code == 200
                with anyio.move_on_after(1.5):
                    async for event in sse_events(taking_over):
                        second.append(event)
    received = log_texts(first) + log_texts(second)
    assert sorted(received) == sorted(f"broadcast {i}/{total}" for i in range(1, total + 1))
    assert len(received) == len(set(received)), "a message was delivered twice"
    assert log_texts(first), "the old GET delivered part of it"


async def test_plain_get_on_another_replica_replays_nothing_an_open_get_delivered(
    mcp_servers: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    """The previous GET, idle but still open on one replica; the next one on another."""
    one, two = mcp_servers["sdk-redis"], mcp_servers["sdk-replica"]
    session = await RawSession(http, one.url).initialize()
    other = RawSession(http, two.url, session_id=session.session_id)
    for round_ in range(4):
        here, there = (session, other) if round_ % 2 == 0 else (other, session)
        assert await session.run_tool("broadcast", {"n": 3}) == "sent 3"
        async with here.get() as response:
            events = sse_events(response)
            got = await until_priming(events)
            assert log_texts(got) == [f"broadcast {i}/3" for i in range(1, 4)], round_
            await anyio.sleep(0.3)  # delivered, and the connection stays open
            async with there.get() as moved:
                assert moved.status_code == 200
                again = await until_priming(sse_events(moved))
            assert log_texts(again) == [], f"delivered twice in round {round_}"
            rest: list[SSE] = []
            with anyio.fail_after(5):  # the takeover ends the old connection
                async for event in events:
                    rest.append(event)
            assert log_texts(rest) == []


class _Store:
    """Stands for a memory store: buffers sharing one share its registry."""


@contextlib.asynccontextmanager
async def registry_on(name: str, redis_server: ServerHandle) -> AsyncIterator[Registry]:
    if name == "memory":
        yield MemoryRegistry(_Store())
        return
    retention = ReplayBuffer.from_url("memory://").retention
    client = redis.asyncio.Redis.from_url(redis_server.url)
    backend = RedisBackend(retention, client, prefix=f"mark{uuid.uuid4().hex[:6]}:")
    try:
        yield backend.coordination().registry()
    finally:
        await backend.aclose()
        await client.aclose()


@pytest.mark.parametrize("name", ["memory", "redis"])
async def test_registry_raises_a_mark_and_never_lowers_it(
    name: str, mcp_redis: ServerHandle
) -> None:
    epoch = "3f9a1c0b7d2e"
    early, late = f"{epoch}-7.9c1f0e2a7b3d4c5e.3.1764694800123", f"{epoch}-12"
    async with registry_on(name, mcp_redis) as registry:
        await registry.raise_mark("s", "get", early)  # never creates a record
        assert await registry.get_session("s") is None
        await registry.put_session("s", {"version": "v"}, 60)
        await registry.raise_mark("s", "get", early)  # no mark yet: set
        assert await registry.get_session("s") == {"version": "v", "get": early}
        await registry.raise_mark("s", "get", late)
        await registry.raise_mark("s", "get", early)  # a late write of an older mark
        assert await registry.get_session("s") == {"version": "v", "get": late}
        await registry.raise_mark("s", "get", f"{epoch}-100")  # positions compare as numbers
        assert (await registry.get_session("s") or {})["get"] == f"{epoch}-100"
        await registry.update_session("s", {"get": "not an id"})
        await registry.raise_mark("s", "get", early)  # anything else is replaced
        assert (await registry.get_session("s") or {})["get"] == early

"""A plain GET that replaces the previous one delivers nothing twice, over real HTTP.

A plain GET (no ``Last-Event-ID``) resumes the standalone stream from the
last event handed to a GET connection. Checked on one replica (memory:// and
Redis) with the previous GET closed a moment before, and still open while
messages flow, and on two replicas sharing one Redis with the previous GET
still open on the other one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

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

        async def read_first() -> None:
            async for event in events:  # until the takeover ends it
                first.append(event)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_first)
            tasks.start_soon(session.run_tool, "broadcast", {"n": total})
            with anyio.fail_after(10):
                while len(log_texts(first)) < 10:
                    await anyio.sleep(0.005)
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

"""The GET stream of a busy session over real HTTP: exact, or a 404 with its verdict.

A session's standalone stream (``_GET_stream``) is often idle while request
streams push its events out of ``max_events``. Two promises, checked on
memory:// and Redis, one server and three replicas behind a round-robin proxy:

- a GET that missed nothing is never refused, even when its own last event
  (typically a priming event) was evicted;
- messages stored for a detached GET and then evicted are never silently
  skipped: the next plain GET is a 404 with ``below_floor``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import (
    SSE,
    RawSession,
    ServerProcess,
    spawn_many,
    spawn_replica,
    sse_events,
    wait_ready,
)

pytestmark = pytest.mark.anyio

#: Events kept per session: a countdown of 20 (22 events) pushes out everything before it.
MAX_EVENTS = 12


@dataclass
class Deployment:
    url: str


@pytest.fixture(scope="module")
def deployments(
    mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Deployment]]:
    logs: Path = tmp_path_factory.mktemp("get-stream")
    store = f"{mcp_redis.url}?prefix=gs:"
    apps = {
        "one-memory": ("sdk", "memory://", MAX_EVENTS),
        "one-redis": ("sdk", f"{mcp_redis.url}?prefix=gs1:", MAX_EVENTS),
        **{f"memory-{i}": ("sdk", "memory://get-stream", MAX_EVENTS) for i in range(3)},
    }
    many = spawn_many("get-stream", apps, logs)
    replicas = [
        spawn_replica(f"redis-{i}", store, logs, "--max-events", str(MAX_EVENTS)) for i in range(3)
    ]
    servers: list[ServerProcess] = [*many.values(), *replicas]
    proxies: list[TcpProxy] = []
    try:
        wait_ready(servers)
        out = {name: Deployment(many[name].url) for name in ("one-memory", "one-redis")}
        for name, group in (
            ("three-memory", [many[f"memory-{i}"] for i in range(3)]),
            ("three-redis", replicas),
        ):
            proxy = TcpProxy([("127.0.0.1", s.port) for s in group]).start()
            proxies.append(proxy)
            out[name] = Deployment(f"http://{proxy.host}:{proxy.port}/mcp")
        yield out
    finally:
        for proxy in proxies:
            proxy.stop()
        for server in servers:
            server.stop()


@pytest.fixture(params=["one-memory", "one-redis", "three-memory", "three-redis"])
def deployment(request: pytest.FixtureRequest, deployments: dict[str, Deployment]) -> Deployment:
    return deployments[request.param]


def messages(events: list[SSE]) -> list[str]:
    return [
        str(e.message["params"]["data"])
        for e in events
        if e.message and e.message.get("method") == "notifications/message"
    ]


async def busy(session: RawSession) -> None:
    """A long tool call whose progress pushes every older event out of the window."""
    assert await session.run_tool("countdown", {"n": 20, "interval_ms": 0}, token="t") == "done 20"


async def test_messages_evicted_while_detached_make_the_next_get_a_404(
    deployment: Deployment, fresh: httpx.AsyncClient
) -> None:
    session = await RawSession(fresh, deployment.url).initialize()
    assert await session.run_tool("broadcast", {"n": 3}) == "sent 3"  # stored, no GET attached
    await busy(session)  # ... and evicted
    async with session.get() as response:
        body = json.loads(await response.aread())
        assert response.status_code == 404, body
    assert body["error"]["data"]["verdict"] == "below_floor"
    assert await session.ping_status() == 404  # ended for every replica


async def test_messages_still_retained_reach_the_next_get(
    deployment: Deployment, fresh: httpx.AsyncClient
) -> None:
    """The control: the same busy session, with the messages stored after the tool call."""
    session = await RawSession(fresh, deployment.url).initialize()
    await busy(session)  # evicts the GET stream's anchor: nothing of it after the anchor
    assert await session.run_tool("broadcast", {"n": 3}) == "sent 3"
    got: list[SSE] = []
    with anyio.fail_after(10):
        async with session.get() as response:
            assert response.status_code == 200, await response.aread()
            async for event in sse_events(response):
                got.append(event)
                if event.priming:
                    break  # the priming event follows the replay
    assert messages(got) == ["broadcast 1/3", "broadcast 2/3", "broadcast 3/3"]
    assert await session.ping_status() == 200


async def test_an_idle_get_whose_priming_event_was_evicted_resumes(
    deployment: Deployment, fresh: httpx.AsyncClient
) -> None:
    session = await RawSession(fresh, deployment.url).initialize()
    with anyio.fail_after(15):
        async with session.get() as response:
            assert response.status_code == 200
            first = await anext(sse_events(response))
            assert first.priming and first.id
            await busy(session)  # the GET stays open and idle; its priming event is evicted
        # the connection is gone (an idle timeout, a replica restart): reconnect
        got: list[SSE] = []
        async with session.get(first.id) as response:
            assert response.status_code == 200, await response.aread()
            events = sse_events(response)
            got.append(await anext(events))
            assert got[0].priming and got[0].id != first.id  # nothing missed, a new cursor
            assert await session.run_tool("broadcast", {"n": 2}) == "sent 2"
            async for event in events:
                got.append(event)
                if len(messages(got)) == 2:
                    break
    assert messages(got) == ["broadcast 1/2", "broadcast 2/2"]
    assert await session.ping_status() == 200

"""The store-backed SubscriptionBus: every listener on every replica, once each, in one order.

Two buses on one store act as two replicas; runs on memory, fakeredis, a
real Redis and a Redis Cluster, and through a proxy that severs the readers'
connections mid-stream.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import anyio
import pytest
from fakeredis import FakeAsyncRedis, FakeServer
from mcp.server.subscriptions import (
    PromptsListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from replaystore import ReplayBuffer
from replaystore.mcp.subscriptions import StoreSubscriptionBus, decode_event, encode_event
from replaystore.testing.proxy import TcpProxy
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.anyio

MakeBus = Callable[[], Awaitable[StoreSubscriptionBus]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "fakeredis", "redis", "cluster"])
async def make_bus(
    request: pytest.FixtureRequest, real_servers: RealServers
) -> AsyncIterator[MakeBus]:
    kind = request.param
    prefix = f"l{uuid.uuid4().hex[:10]}:"
    fake = FakeServer()
    async with AsyncExitStack() as stack:

        async def factory() -> StoreSubscriptionBus:
            if kind == "memory":
                buffer = ReplayBuffer.from_url(f"memory://{prefix}")
            elif kind == "fakeredis":
                client = FakeAsyncRedis(server=fake)
                buffer = ReplayBuffer.from_url("redis://", prefix=prefix, client=client)
            else:
                buffer = ReplayBuffer.from_url(real_servers.shared(kind).url, prefix=prefix)
            await stack.enter_async_context(buffer)
            bus = StoreSubscriptionBus(block=0.2)
            bus.bind(buffer)
            await stack.enter_async_context(bus.running())
            return bus

        yield factory


def _events(n: int) -> list[ServerEvent]:
    kinds: list[ServerEvent] = [ToolsListChanged(), PromptsListChanged()]
    return [ResourceUpdated(uri=f"file:///{i}") if i % 3 else kinds[i % 2] for i in range(n)]


async def _until(received: list[list[ServerEvent]], n: int) -> None:
    for _ in range(1000):  # a hang guard: 10 s
        if all(len(got) >= n for got in received):
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"not every listener got {n} events: {[len(r) for r in received]}")


async def test_every_listener_on_every_replica_gets_each_event_once_in_one_order(
    make_bus: MakeBus,
) -> None:
    a, b = await make_bus(), await make_bus()
    received: list[list[ServerEvent]] = [[], [], []]
    a.subscribe(received[0].append)
    b.subscribe(received[1].append)
    stop = b.subscribe(received[2].append)
    from_a = [ResourceUpdated(uri=f"a/{i}") for i in range(30)]
    from_b = [ResourceUpdated(uri=f"b/{i}") for i in range(30)]

    async def publish(bus: StoreSubscriptionBus, chunk: list[ResourceUpdated]) -> None:
        for event in chunk:
            await bus.publish(event)

    async with anyio.create_task_group() as tg:
        tg.start_soon(publish, a, from_a)
        tg.start_soon(publish, b, from_b)
    await _until(received, 60)
    await anyio.sleep(0.3)  # nothing more arrives: once each
    assert received[0] == received[1] == received[2]  # one order everywhere
    assert len(received[0]) == 60
    # Each publisher's events in the order it published them.
    assert [e for e in received[0] if e in from_a] == from_a
    assert [e for e in received[0] if e in from_b] == from_b
    stop()
    await a.publish(ToolsListChanged())
    await _until(received[:2], 61)
    assert len(received[2]) == 60


async def test_a_severed_reader_loses_nothing(real_servers: RealServers) -> None:
    handle = real_servers.shared("redis")
    host, port = handle.url.split("//")[1].split("/")[0].split(":")
    prefix = f"lb{uuid.uuid4().hex[:8]}:"
    with TcpProxy([(host, int(port))]) as proxy:
        async with (
            ReplayBuffer.from_url(proxy.url(), prefix=prefix) as through_proxy,
            ReplayBuffer.from_url(handle.url, prefix=prefix) as direct,
        ):
            reader, writer = StoreSubscriptionBus(block=0.2), StoreSubscriptionBus(block=0.2)
            reader.bind(through_proxy)
            writer.bind(direct)
            got: list[ServerEvent] = []
            reader.subscribe(got.append)
            async with reader.running(), writer.running():
                events = _events(40)
                for i, event in enumerate(events):
                    await writer.publish(event)
                    if i % 10 == 5:
                        proxy.sever_all()
                await _until([got], 40)
            assert got == events
            assert reader.gaps == 0


def test_events_round_trip_and_unknown_ones_are_skipped() -> None:
    for event in _events(6):
        assert decode_event(encode_event(event)) == event
    assert decode_event("something-new") is None

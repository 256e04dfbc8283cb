"""Fixtures for the MCP integration tests: one real Redis and a few real server processes.

All servers start together, once per test session, so their (slow) imports
overlap. Every Redis-backed server gets its own key prefix, except the two
"replicas", which share one on purpose.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from replaystore.testing.servers import ServerHandle
from tests.mcp._support import EXAMPLE_SERVER, ServerProcess, spawn, spawn_many, wait_ready
from tests.plugins.servers import RealServers

#: Events kept per session by the "small" server: a countdown of 40 evicts its start.
SMALL_MAX_EVENTS = 12


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def mcp_redis(real_servers: RealServers) -> Iterator[ServerHandle]:
    handle = real_servers.own("redis")
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def doomed_redis(real_servers: RealServers) -> Iterator[ServerHandle]:
    """A Redis that one test stops, to see a store outage over HTTP."""
    handle = real_servers.own("redis")
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def mcp_servers(
    mcp_redis: ServerHandle,
    doomed_redis: ServerHandle,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, ServerProcess]]:
    """``sdk-redis`` is ``replaystore example-server``; the rest share a second process.

    ``sdk-redis`` and ``sdk-replica`` are replicas: two processes, one Redis, one prefix.
    """
    logs = tmp_path_factory.mktemp("mcp-servers")
    shared = f"{mcp_redis.url}?prefix=mcp1:"
    servers = {"sdk-redis": spawn("sdk-redis", EXAMPLE_SERVER, shared, 10_000, logs)}
    apps = {
        "sdk-replica": ("sdk", shared, 10_000),
        "sdk-memory": ("sdk", "memory://", 10_000),
        "sdk-small": ("sdk", f"{mcp_redis.url}?prefix=mcp2:", SMALL_MAX_EVENTS),
        "sdk-doomed": ("sdk", f"{doomed_redis.url}?prefix=mcp4:", 1_000),
        "fastmcp": ("fastmcp", f"{mcp_redis.url}?prefix=mcp3:", 10_000),
    }
    servers.update(spawn_many("multi", apps, logs))
    try:
        wait_ready(list(servers.values()))
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(params=["sdk-redis", "sdk-memory"])
def sdk(request: pytest.FixtureRequest, mcp_servers: dict[str, ServerProcess]) -> ServerProcess:
    """The SDK example server, once on a real Redis and once on memory://."""
    return mcp_servers[request.param]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as client:
        yield client


@pytest.fixture(scope="module")
def store(real_servers: RealServers) -> Iterator[ServerHandle]:
    """A Redis of the test module's own: its tests make it refuse, or read its statistics."""
    handle = real_servers.own("redis")
    yield handle
    handle.stop()


@pytest.fixture
async def fresh() -> AsyncIterator[httpx.AsyncClient]:
    """A raw client with a new connection per request: behind a round-robin proxy,
    each request (and each reconnect) lands on the next replica."""
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(15.0), limits=httpx.Limits(max_keepalive_connections=0)
    ) as client:
        yield client

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

from replaystore.testing.servers import ServerHandle
from replaystore.testing.sse import sse_events
from tests.mcp._support import RawSession, ServerProcess, spawn_replica, wait_ready
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
    started = [spawn_replica(name, url, logs, "--log-level", "info") for name in ("a", "b")]
    try:
        wait_ready(started)
        yield started
    finally:
        for server in started:
            server.stop()


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
            _refused(await http.post(a.url, json=_initialize(), headers=fresh), out_of_memory)
            # (And one sent on a session: refused alike, not a 200 cut short.)
            _refused(
                await http.post(a.url, json=_initialize(), headers=session.headers()),
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
            # The standalone GET stream: refused (its mark cannot be kept).
            async with session.get() as response:
                await response.aread()
                assert response.status_code == 503, response.text
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


def _initialize() -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }

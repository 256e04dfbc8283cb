"""``wait_replicas`` with no replica to acknowledge, over HTTP: refused at once, never stalled.

Two example-server replicas on a Redis of this module alone, asked for
durable writes (``wait_replicas=1``) that no replica can acknowledge (as
after a failover to a primary whose replica is gone). A new session is 503
naming why within seconds (a session that a failover would lose is not
handed out), ``/healthz`` says 503 too, and the log tells the outage in a
few lines, not one per retry.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from replaystore.testing.mcp import initialize_message
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import RawSession, ServerProcess, replica_pair
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.anyio

#: The bound the resumes and refusals must answer within (seconds).
ANSWERED_WITHIN = 15.0


@pytest.fixture(scope="module")
def lonely_redis(real_servers: RealServers) -> Iterator[ServerHandle]:
    handle = real_servers.own("redis")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def replicas(
    lonely_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    logs = tmp_path_factory.mktemp("durable")
    url = f"{lonely_redis.url}?prefix=dr:&wait_replicas=1&wait_timeout=0.2"
    with replica_pair(url, logs) as started:
        yield started


async def test_unacknowledged_writes_are_503_at_once_and_health_says_so(
    replicas: list[ServerProcess],
) -> None:
    a, b = replicas
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        for server in (a, b):
            for _ in range(3):
                began = time.monotonic()
                body = initialize_message()
                response = await http.post(
                    server.url, json=body, headers=RawSession(http, server.url).headers()
                )
                assert time.monotonic() - began < ANSWERED_WITHIN
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == "1"
                error = response.json()["error"]
                assert "could not make it durable" in error["message"], error
                assert "acknowledged by 0 of 1" in error["message"], error
                assert error["data"] == {
                    "verdict": None,
                    "reason": "storage_error",
                    "store": "unreplicated",
                }
            health = await http.get(f"{server.base}/healthz")
            assert health.status_code == 503, health.text
            assert "could not make it durable" in health.text, health.text
    for server in (a, b):
        log = server.log_tail(20_000)
        assert "Traceback" not in log and "without completing response" not in log, log
        assert "unreachable or too slow" not in log, log

"""Orphaned tasks end (or run again) with nobody reading them: real replicas, SIGKILLed runners.

Every check here reads the store with plain ``HGET``/``HGETALL`` (never a task
script, which would itself apply the lapse rule) or follows the task on a
listen stream: no ``tasks/get`` is ever sent, so what ends the task is the
replicas' background scan.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis

from replaystore.testing.servers import ServerHandle
from tests.mcp._support import ServerProcess, spawn_replica, sse_events, wait_ready
from tests.mcp.test_tasks import Modern

pytestmark = pytest.mark.anyio

LEASE_SECONDS = 2.0
TERMINAL = ("completed", "failed", "cancelled")


@pytest.fixture
def replicas(mcp_redis: ServerHandle, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[
    list[ServerProcess]
]:
    """Three example-server replicas on one Redis, under a key prefix of their own."""
    prefix = f"treap{request.node.name[-12:]}:".replace("[", "").replace("]", "")
    store = f"{mcp_redis.url}?prefix={prefix}"
    options = ("--lease-seconds", str(LEASE_SECONDS))
    servers = [spawn_replica(f"treap-{i}", store, tmp_path, *options) for i in range(3)]
    try:
        wait_ready(servers)
        yield servers
    finally:
        for server in servers:
            server.stop()


def _hash(mcp_redis: ServerHandle, replica: ServerProcess, task_id: str) -> dict[str, bytes]:
    """The task's record as stored, read without running any task script."""
    prefix = replica.store_url.rsplit("prefix=", 1)[1]
    connection = redis.Redis.from_url(mcp_redis.url)
    try:
        fields: dict[bytes, bytes] = connection.hgetall(f"{prefix}{{task:{task_id}}}:task")
    finally:
        connection.close()
    return {key.decode(): value for key, value in fields.items()}


async def _stored_status(
    mcp_redis: ServerHandle, replica: ServerProcess, task_id: str, *statuses: str
) -> dict[str, bytes]:
    """Wait until the stored record has one of ``statuses`` (a hang guard, not a timing check)."""
    with anyio.fail_after(20):
        while True:
            fields = _hash(mcp_redis, replica, task_id)
            if fields.get("st", b"").decode() in statuses:
                return fields
            await anyio.sleep(0.05)


def _kill(replica: ServerProcess) -> float:
    replica.proc.send_signal(signal.SIGKILL)
    replica.proc.wait(10)
    return time.monotonic()


async def test_an_orphaned_task_ends_failed_in_the_store_with_nobody_reading_it(
    replicas: list[ServerProcess], mcp_redis: ServerHandle, fresh: httpx.AsyncClient
) -> None:
    doomed = replicas[0]
    task_id = (await Modern(fresh, doomed.url).call("ask", {}))["taskId"]
    await _stored_status(mcp_redis, doomed, task_id, "input_required")
    killed = _kill(doomed)
    fields = await _stored_status(mcp_redis, doomed, task_id, *TERMINAL)
    elapsed = time.monotonic() - killed
    assert fields["st"] == b"failed" and "lost" in fields
    # The lease, then at most one scan interval (a quarter of the lease) and a round trip.
    assert elapsed <= LEASE_SECONDS * 1.25 + 1.0, elapsed


async def test_an_orphaned_idempotent_task_runs_again_with_nobody_reading_it(
    replicas: list[ServerProcess], mcp_redis: ServerHandle, fresh: httpx.AsyncClient
) -> None:
    doomed = replicas[0]
    created = await Modern(fresh, doomed.url).call("countdown", {"n": 15, "interval_ms": 100})
    task_id = created["taskId"]
    await anyio.sleep(0.5)
    _kill(doomed)
    fields = await _stored_status(mcp_redis, doomed, task_id, *TERMINAL)
    assert fields["st"] == b"completed", fields
    assert fields["att"] == b"2"  # exactly one survivor ran it again
    # What a client reads afterwards is that second run's result.
    done = await Modern(fresh, replicas[1].url).get(task_id)
    assert done["result"]["content"][0]["text"] == "done 15"
    assert done["createdAt"] == created["createdAt"]


async def _listen_until_terminal(
    fresh: httpx.AsyncClient, url: str, task_id: str, meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """The ``notifications/tasks`` params a listen stream on ``url`` carries, up to the end."""
    body = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": [task_id]}, "_meta": meta},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
    }
    updates: list[dict[str, Any]] = []
    with anyio.fail_after(30):  # a hang guard
        async with fresh.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200
            async for event in sse_events(response):
                message = event.message
                if message and message.get("method") == "notifications/tasks":
                    updates.append(message["params"])
                    if message["params"]["status"] in TERMINAL:
                        return updates
    raise AssertionError("the listen stream ended before the task did")


@pytest.mark.parametrize(
    ("tool", "arguments", "end"),
    [("ask", {}, "failed"), ("countdown", {"n": 15, "interval_ms": 100}, "completed")],
)
async def test_a_listener_on_a_survivor_gets_the_end_of_a_task_whose_runner_was_killed(
    replicas: list[ServerProcess],
    mcp_redis: ServerHandle,
    fresh: httpx.AsyncClient,
    tool: str,
    arguments: dict[str, Any],
    end: str,
) -> None:
    """The runner is SIGKILLed; the only client listens on a survivor and never polls."""
    doomed, listener = replicas[0], replicas[1]
    client = Modern(fresh, doomed.url)
    task_id = (await client.call(tool, arguments))["taskId"]
    updates: list[dict[str, Any]] = []

    async def listen() -> None:
        updates.extend(await _listen_until_terminal(fresh, listener.url, task_id, client.meta))

    async with anyio.create_task_group() as group:
        group.start_soon(listen)
        await anyio.sleep(0.5)  # the listener follows the task
        _kill(doomed)
    assert updates[0]["status"] in ("working", "input_required")
    last = updates[-1]
    assert last["status"] == end, last
    if end == "failed":
        assert last["error"]["code"] == -32603 and "stopped" in last["error"]["message"]
    else:
        assert last["result"]["content"][0]["text"] == "done 15"
    stored = _hash(mcp_redis, doomed, task_id)
    assert stored["st"].decode() == end

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
from tests.mcp.tasks._support import Modern

pytestmark = pytest.mark.anyio

LEASE_SECONDS = 2.0
TERMINAL = ("completed", "failed", "cancelled")


class Replicas:
    """Two survivors, and runners to kill (one per test), all on one Redis and key prefix."""

    def __init__(self, store: str, logs: Path, runners: int) -> None:
        self.store = store
        self.logs = logs
        self.survivors = [self._spawn(f"treap-survivor-{i}") for i in range(2)]
        self.spare = [self._spawn(f"treap-runner-{i}") for i in range(runners)]
        self.started = [*self.survivors, *self.spare]

    def _spawn(self, name: str) -> ServerProcess:
        return spawn_replica(name, self.store, self.logs, "--lease-seconds", str(LEASE_SECONDS))

    def runner(self) -> ServerProcess:
        """A replica of its own for one test to run a task on, and to kill."""
        if self.spare:
            return self.spare.pop()
        server = self._spawn(f"treap-runner-{len(self.started)}")
        self.started.append(server)
        wait_ready([server])
        return server


@pytest.fixture(scope="module")
def replicas(
    mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    # Started together: one wait for all of them, however many tests run.
    started = Replicas(
        f"{mcp_redis.url}?prefix=treap:", tmp_path_factory.mktemp("task-reaper"), runners=2
    )
    try:
        wait_ready(started.started)
        yield started
    finally:
        for server in started.started:
            server.stop()


def _hash(mcp_redis: ServerHandle, replica: ServerProcess, task_id: str) -> dict[str, bytes]:
    """The task's record as stored, read without running any task script."""
    prefix = replica.store_url.rsplit("prefix=", 1)[1]
    connection = redis.Redis.from_url(mcp_redis.url)
    try:
        # Behind the app's namespace (the example server's name).
        key = f"{prefix}{{task:replaystore-example:{task_id}}}:task"
        fields: dict[bytes, bytes] = connection.hgetall(key)
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


async def test_orphaned_tasks_end_in_the_store_with_nobody_reading_them(
    replicas: Replicas, mcp_redis: ServerHandle, fresh: httpx.AsyncClient
) -> None:
    """Two tasks on a runner that is SIGKILLed; no client reads them again.

    ``ask`` ends failed within two leases (and one scan); ``countdown``
    (idempotent) is run again by exactly one of the two survivors.
    """
    doomed = replicas.runner()
    client = Modern(fresh, doomed.url)
    lost = (await client.call("ask", {}))["taskId"]
    created = await client.call("countdown", {"n": 15, "interval_ms": 100})
    rerun = created["taskId"]
    await _stored_status(mcp_redis, doomed, lost, "input_required")
    killed = _kill(doomed)
    fields = await _stored_status(mcp_redis, doomed, lost, *TERMINAL)
    elapsed = time.monotonic() - killed
    assert fields["st"] == b"failed" and "lost" in fields
    # The lease, one more lease (a lapse is judged twice, a lease apart, so a
    # stalled store fails no live runner), then at most a scan's slack and a round trip.
    assert elapsed <= 2 * LEASE_SECONDS + 1.0, elapsed
    fields = await _stored_status(mcp_redis, doomed, rerun, *TERMINAL)
    assert fields["st"] == b"completed", fields
    assert fields["att"] == b"2"  # exactly one survivor ran it again
    # What a client reads afterwards is that second run's result.
    done = await Modern(fresh, replicas.survivors[0].url).get(rerun)
    assert done["result"]["content"][0]["text"] == "done 15"
    assert done["createdAt"] == created["createdAt"]
    failed = await Modern(fresh, replicas.survivors[1].url).get(lost)
    assert failed["error"]["code"] == -32603 and "stopped" in failed["error"]["message"]


async def test_a_listener_on_a_survivor_gets_the_end_of_tasks_whose_runner_was_killed(
    replicas: Replicas, mcp_redis: ServerHandle, fresh: httpx.AsyncClient
) -> None:
    """The runner is SIGKILLed; the only client listens on a survivor and never polls.

    The listen stream carries ``failed`` for ``ask`` and the second run's
    result for ``countdown``, each last notification equal to the store's end.
    """
    doomed, listener = replicas.runner(), replicas.survivors[1]
    client = Modern(fresh, doomed.url)
    lost = (await client.call("ask", {}))["taskId"]
    rerun = (await client.call("countdown", {"n": 15, "interval_ms": 100}))["taskId"]
    updates: list[dict[str, Any]] = []

    async def listen() -> None:
        updates.extend(await _listen(fresh, listener.url, [lost, rerun], client.meta))

    async with anyio.create_task_group() as group:
        group.start_soon(listen)
        await anyio.sleep(0.5)  # the listener follows both tasks
        _kill(doomed)
    first: dict[str, dict[str, Any]] = {}
    for update in updates:
        first.setdefault(update["taskId"], update)
    last = {update["taskId"]: update for update in updates}
    assert first[lost]["status"] in ("working", "input_required")
    assert first[rerun]["status"] == "working"
    assert last[lost]["status"] == "failed", last[lost]
    assert last[lost]["error"]["code"] == -32603 and "stopped" in last[lost]["error"]["message"]
    assert last[rerun]["status"] == "completed", last[rerun]
    assert last[rerun]["result"]["content"][0]["text"] == "done 15"
    assert _hash(mcp_redis, doomed, lost)["st"] == b"failed"
    assert _hash(mcp_redis, doomed, rerun)["st"] == b"completed"


async def _listen(
    fresh: httpx.AsyncClient, url: str, task_ids: list[str], meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """The ``notifications/tasks`` params a listen stream on ``url`` carries, until all ended."""
    body = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "subscriptions/listen",
        "params": {"notifications": {"taskIds": task_ids}, "_meta": meta},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
    }
    updates: list[dict[str, Any]] = []
    ended: set[str] = set()
    with anyio.fail_after(30):  # a hang guard
        async with fresh.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200
            async for event in sse_events(response):
                message = event.message
                if message and message.get("method") == "notifications/tasks":
                    updates.append(message["params"])
                    if message["params"]["status"] in TERMINAL:
                        ended.add(message["params"]["taskId"])
                        if ended == set(task_ids):
                            return updates
    raise AssertionError("the listen stream ended before the tasks did")

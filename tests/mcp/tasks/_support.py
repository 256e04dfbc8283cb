"""A raw 2026-07-28 client for durable tasks, and task scenarios run on SDK and FastMCP replicas.

Shared by the task modules here, ``tests/mcp/fastmcp/test_tasks_fastmcp.py`` (the same
scenarios on FastMCP replicas) and the modules that create tasks to watch
something else (metrics, restores).
"""

from __future__ import annotations

import itertools
import signal
import time
from typing import Any

import anyio
import httpx
import redis
import redis.asyncio

from replaystore.testing.servers import ServerHandle
from tests.mcp._support import ProxiedReplicas, ServerProcess, sse_events, wait_ready

EXTENSION = "io.modelcontextprotocol/tasks"


LEASE_SECONDS = 2.0


TaskSet = ProxiedReplicas


_ids = itertools.count(1)


class Modern:
    """A 2026-07-28 client speaking raw JSON-RPC over HTTP, with or without the extension."""

    def __init__(self, http: httpx.AsyncClient, url: str, *, tasks: bool = True) -> None:
        self.http = http
        self.url = url
        extensions = {EXTENSION: {}} if tasks else {}
        self.meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
        }

    def envelope(
        self, method: str, params: dict[str, Any], name: str
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The body and headers of a request (for a caller that reads the answer as a stream)."""
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": method,
            "Mcp-Name": name,
        }
        body = {
            "jsonrpc": "2.0",
            "id": next(_ids),
            "method": method,
            "params": {**params, "_meta": self.meta},
        }
        return body, headers

    async def send(self, method: str, params: dict[str, Any], name: str) -> dict[str, Any]:
        """The JSON-RPC response (``result`` or ``error``)."""
        body, headers = self.envelope(method, params, name)
        response = await self.http.post(self.url, json=body, headers=headers)
        message: dict[str, Any] = response.json()
        return message

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        reply = await self.send("tools/call", {"name": tool, "arguments": arguments}, tool)
        result: dict[str, Any] = reply["result"]
        return result

    async def task(self, method: str, task_id: str, **params: Any) -> dict[str, Any]:
        return await self.send(method, {"taskId": task_id, **params}, task_id)

    async def get(self, task_id: str) -> dict[str, Any]:
        reply = await self.task("tasks/get", task_id)
        assert "result" in reply, reply
        result: dict[str, Any] = reply["result"]
        return result

    async def wait(self, task_id: str, *statuses: str) -> dict[str, Any]:
        with anyio.fail_after(20):  # a hang guard, not a timing assertion
            while True:
                task = await self.get(task_id)
                if task["status"] in statuses:
                    return task
                await anyio.sleep(0.05)


def _text(task: dict[str, Any]) -> str:
    text: str = task["result"]["content"][0]["text"]
    return text


async def rerun_on_a_survivor(
    replicas: list[ServerProcess], mcp_redis: ServerHandle, fresh: httpx.AsyncClient
) -> None:
    """``countdown`` (idempotent) on the first replica, SIGKILLed mid-run: a survivor re-runs it.

    Both survivors poll the task at once; the store lets exactly one claim it,
    which the task's run count (2) shows.
    """
    doomed, *survivors = replicas
    prefix = doomed.store_url.rsplit("prefix=", 1)[1]
    try:
        wait_ready(replicas)
        on_doomed = Modern(fresh, doomed.url)
        created = await on_doomed.call("countdown", {"n": 15, "interval_ms": 100})
        task_id = created["taskId"]
        await anyio.sleep(0.5)
        with redis.Redis.from_url(mcp_redis.url) as lookup:  # behind the app's namespace
            [task_key] = lookup.keys(f"{prefix}{{task:*:{task_id}}}:task")
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(10)
        killed = time.monotonic()
        ends: list[dict[str, Any]] = []
        claimed: list[float] = []

        async def poll(url: str) -> None:
            ends.append(await Modern(fresh, url).wait(task_id, "completed", "failed", "cancelled"))

        async def watch_the_claim() -> None:
            # The second attempt begins when a survivor claims the task (its run
            # then takes as long as the machine lets it: not what the lease bounds).
            async with redis.asyncio.Redis.from_url(mcp_redis.url) as connection:
                with anyio.fail_after(20):
                    while True:
                        if await connection.hget(task_key, "att") == b"2":
                            break
                        await anyio.sleep(0.02)
            claimed.append(time.monotonic() - killed)

        async with anyio.create_task_group() as group:
            group.start_soon(watch_the_claim)
            for survivor in survivors:
                group.start_soon(poll, survivor.url)
        assert [end["status"] for end in ends] == ["completed"] * len(survivors), ends
        assert _text(ends[0]) == "done 15" and ends[0] == ends[1]
        assert ends[0]["createdAt"] == created["createdAt"]
        # Claimed once the lease ran out and stayed lapsed one more lease (judged twice).
        assert claimed[0] <= 2 * LEASE_SECONDS + 1.0, claimed
        connection = redis.Redis.from_url(mcp_redis.url)
        try:
            assert connection.hget(task_key, "att") == b"2"  # one survivor ran it: one claim
        finally:
            connection.close()
    finally:
        for server in replicas:
            server.stop()


async def listen_follows_a_task_on_another_replica(
    any_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    """Listen on replica 1 to a task running on replica 0; the last notification is tasks/get."""
    runner, listener = any_set.replicas[0], any_set.replicas[1]
    on_runner = Modern(fresh, runner.url)
    task_id = (await on_runner.call("countdown", {"n": 5, "interval_ms": 100}))["taskId"]
    body = {
        "jsonrpc": "2.0",
        "id": 77,
        "method": "subscriptions/listen",
        "params": {
            "notifications": {"taskIds": [task_id, "D" * 24]},
            "_meta": on_runner.meta,
        },
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
    }
    frames: list[dict[str, Any]] = []
    with anyio.fail_after(20):  # a hang guard
        async with fresh.stream("POST", listener.url, json=body, headers=headers) as response:
            assert response.status_code == 200
            async for event in sse_events(response):
                message = event.message
                if not message or "method" not in message:
                    continue
                frames.append(message)
                if message["method"] == "notifications/tasks" and message["params"]["status"] in (
                    "completed",
                    "failed",
                    "cancelled",
                ):
                    break
    ack, *updates = frames
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"]["taskIds"] == [task_id]  # the unknown id left out
    assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == 77
    assert [u["method"] for u in updates] == ["notifications/tasks"] * len(updates)
    assert updates[0]["params"]["status"] == "working"
    last = dict(updates[-1]["params"])
    assert last.pop("_meta")["io.modelcontextprotocol/subscriptionId"] == 77
    got = await Modern(fresh, any_set.replicas[2].url).get(task_id)
    got.pop("_meta", None)
    assert got.pop("resultType") == "complete"
    assert last == got  # the last notification is what tasks/get says


def _task_field(url: str, task_id: str, field: str) -> bytes | None:
    """A field of the task's record, read raw (behind whatever namespace the app uses)."""
    with redis.Redis.from_url(url) as lookup:
        [key] = lookup.keys(f"*{{task:*:{task_id}}}:task")
        value: bytes | None = lookup.hget(key, field)  # type: ignore[assignment]
        return value

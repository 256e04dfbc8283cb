"""A FastMCP ``Client`` calling tools as tasks, with ``ClientTasks``, against real example servers.

Two ``replaystore example-server`` processes on the Redis of the test
session; the client talks to the first, and the second checks what the store
holds (a task made on one replica reads the same on the other).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp import Client

from replaystore.mcp.client.extension import ClientTasks
from replaystore.mcp.client.tasks import TaskCancelledError, TaskClient, TaskError
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import ServerProcess, spawn_replica, stopped_on_exit, wait_ready

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]


@pytest.fixture(scope="module")
def replicas(
    mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    logs: Path = tmp_path_factory.mktemp("client-tasks")
    store = f"{mcp_redis.url}?prefix=ctasks:"
    servers = [spawn_replica(f"ctasks-{i}", store, logs) for i in range(2)]
    with stopped_on_exit(servers):
        wait_ready(servers)
        yield servers


async def test_a_fastmcp_client_gets_a_task_tools_result_as_for_a_plain_call(
    replicas: list[ServerProcess],
) -> None:
    created: list[str] = []
    tasks = ClientTasks(on_created=created.append)  # a plain function will do
    async with Client(replicas[0].url, extensions=[tasks]) as client:
        with anyio.fail_after(30):
            result = await client.call_tool("countdown", {"n": 3, "interval_ms": 50})
    assert result.structured_content == {"result": "done 3"}
    assert result.content[0].text == "done 3"  # type: ignore[union-attr]
    # It ran as a task: the store has it, completed, with the same result.
    assert len(created) == 1
    async with TaskClient(replicas[1].url) as other:
        task = await other.get(created[0])
    assert task["status"] == "completed"
    assert task["result"]["content"][0]["text"] == "done 3"


async def test_input_requests_are_answered_through_the_callback_once(
    replicas: list[ServerProcess],
) -> None:
    asked: list[tuple[str, dict[str, Any]]] = []

    async def on_input(key: str, request: dict[str, Any]) -> dict[str, Any]:
        asked.append((key, request))
        return {"action": "accept", "content": {"name": "Ada"}}

    async with Client(replicas[0].url, extensions=[ClientTasks(on_input=on_input)]) as client:
        with anyio.fail_after(30):
            result = await client.call_tool("ask", {"question": "Who?"})
    assert result.structured_content == {"result": "hello Ada"}
    assert [(key, r["method"], r["params"]["message"]) for key, r in asked] == [
        ("r1", "elicitation/create", "Who?")
    ]


async def test_a_task_that_needs_input_without_a_callback_raises(
    replicas: list[ServerProcess],
) -> None:
    async with Client(replicas[0].url, extensions=[ClientTasks()]) as client:
        with anyio.fail_after(30), pytest.raises(TaskError, match="needs input"):
            await client.call_tool("ask", {})


async def test_a_task_cancelled_elsewhere_raises_cancelled(
    replicas: list[ServerProcess],
) -> None:
    async def cancel_at_once(task_id: str) -> None:
        async with TaskClient(replicas[1].url) as other:
            await other.cancel(task_id)

    tasks = ClientTasks(on_created=cancel_at_once)
    async with Client(replicas[0].url, extensions=[tasks]) as client:
        with anyio.fail_after(30), pytest.raises(TaskCancelledError):
            await client.call_tool("countdown", {"n": 100, "interval_ms": 100})

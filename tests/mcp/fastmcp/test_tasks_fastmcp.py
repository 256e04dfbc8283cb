"""Durable tasks on FastMCP 4 replicas: the same rules as on the SDK, through FastMCP's extension.

Three ``tests.mcp.fastmcp_app`` processes on one real Redis behind a
round-robin proxy, a new connection per request: a task is created on one
replica and read, cancelled or followed on a listen stream on the others; a
runner killed with SIGKILL fails its task within the lease, unless the tool is
idempotent: then one survivor runs it again.
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
from mcp.server.subscriptions import ToolsListChanged

from replaystore import ReplayBuffer
from replaystore.mcp.subscriptions import StoreSubscriptionBus
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import ServerProcess, _popen, find_free_port, sse_events, wait_ready
from tests.mcp.tasks._support import (
    EXTENSION,
    LEASE_SECONDS,
    Modern,
    TaskSet,
    listen_follows_a_task_on_another_replica,
    rerun_on_a_survivor,
)

pytestmark = pytest.mark.anyio

ENDED = ("completed", "failed", "cancelled")


def spawn_fastmcp(name: str, store_url: str, log_dir: Path) -> ServerProcess:
    """One FastMCP replica serving ``countdown`` and ``ask`` as tasks too."""
    port = find_free_port()
    log_path = log_dir / f"{name}.log"
    args = ["-m", "tests.mcp.fastmcp_app", "--port", str(port), "--url", store_url,
            "--lease-seconds", str(LEASE_SECONDS), "--log-level", "warning"]  # fmt: skip
    return ServerProcess(name, port, _popen(args, log_path), log_path, store_url)


@pytest.fixture(scope="module")
def fastmcp_set(
    mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TaskSet]:
    logs = tmp_path_factory.mktemp("fastmcp-task-replicas")
    store = f"{mcp_redis.url}?prefix=ftk:"
    replicas = [spawn_fastmcp(f"fastmcp-task-{i}", store, logs) for i in range(3)]
    proxy: TcpProxy | None = None
    try:
        wait_ready(replicas)
        proxy = TcpProxy([("127.0.0.1", s.port) for s in replicas]).start()
        yield TaskSet("fastmcp", replicas, proxy)
    finally:
        if proxy is not None:
            proxy.stop()
        for server in replicas:
            server.stop()


async def test_discover_advertises_the_extension_and_the_listen_streams_served(
    fastmcp_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    for replica in fastmcp_set.replicas:
        reply = await Modern(fresh, replica.url).send("server/discover", {}, "discover")
        capabilities = reply["result"]["capabilities"]
        assert EXTENSION in capabilities["extensions"]
        # subscriptions/listen is served, so change notifications are (as on an SDK replica).
        assert capabilities["tools"]["listChanged"] is True, capabilities
        assert capabilities["prompts"]["listChanged"] is True
        assert capabilities["resources"] == {"listChanged": True, "subscribe": True}


async def test_ctx_elicit_in_a_fastmcp_task_is_answered_on_other_replicas(
    fastmcp_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    runner, reader, answerer = (Modern(fresh, r.url) for r in fastmcp_set.replicas)
    task_id = (await runner.call("ask", {"question": "Who?"}))["taskId"]
    waiting = await reader.wait(task_id, "input_required", *ENDED)
    assert waiting["status"] == "input_required", waiting
    [(key, request)] = waiting["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert request["params"]["message"] == "Who?"
    assert request["params"]["requestedSchema"]["properties"]["name"]["type"] == "string"
    answer = {"action": "accept", "content": {"name": "Ada"}}
    ack = await answerer.task("tasks/update", task_id, inputResponses={key: answer})
    assert ack["result"]["resultType"] == "complete", ack
    done = await reader.wait(task_id, *ENDED)
    assert done["result"]["content"][0]["text"] == "hello Ada", done
    assert done["result"]["isError"] is False
    # Answering the same key again is ignored; the result stays.
    late = {key: {"action": "decline"}}
    assert "result" in await answerer.task("tasks/update", task_id, inputResponses=late)
    assert await runner.get(task_id) == done


async def test_a_partial_answer_keeps_a_fastmcp_task_waiting(
    fastmcp_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    """``greet`` asks through ``ctx.elicit`` and samples at once: two requests outstanding.

    Every request goes through the round-robin proxy, so each lands on the next replica.
    """
    runner = reader = answerer = Modern(fresh, fastmcp_set.url)
    task_id = (await runner.call("greet", {}))["taskId"]
    with anyio.fail_after(20):  # a hang guard: the two requests are stored one after the other
        while True:
            waiting = await reader.wait(task_id, "input_required", *ENDED)
            assert waiting["status"] == "input_required", waiting
            if len(waiting["inputRequests"]) == 2:
                break
            await anyio.sleep(0.05)
    keys = {request["method"]: key for key, request in waiting["inputRequests"].items()}
    assert set(keys) == {"elicitation/create", "sampling/createMessage"}, waiting
    sampled = {
        "role": "assistant",
        "content": {"type": "text", "text": "Hi"},
        "model": "test",
    }
    # The sampling answer and an unknown key: the elicitation is still outstanding.
    partial = {keys["sampling/createMessage"]: sampled, "r999": {"action": "accept"}}
    assert "result" in await answerer.task("tasks/update", task_id, inputResponses=partial)
    await anyio.sleep(0.5)  # the runner picks answers up at its next lease renewal
    still = await reader.get(task_id)
    assert still["status"] == "input_required", still
    assert list(still["inputRequests"]) == [keys["elicitation/create"]]
    named = {keys["elicitation/create"]: {"action": "accept", "content": {"name": "Ada"}}}
    assert "result" in await answerer.task("tasks/update", task_id, inputResponses=named)
    done = await reader.wait(task_id, *ENDED)
    assert done["result"]["content"][0]["text"] == "Hi Ada", done


async def test_a_task_created_on_one_fastmcp_replica_resolves_on_every_other(
    fastmcp_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    client = Modern(fresh, fastmcp_set.url)
    created = await client.call("countdown", {"n": 4, "interval_ms": 150})
    assert created["resultType"] == "task" and created["status"] == "working", created
    task_id = created["taskId"]
    for replica in fastmcp_set.replicas:  # each replica directly, at once
        task = await Modern(fresh, replica.url).get(task_id)
        assert task["resultType"] == "complete" and task["taskId"] == task_id
        assert task["status"] in ("working", "completed")
    done = await client.wait(task_id, "completed")
    assert done["result"]["content"][0]["text"] == "done 4"
    assert done["result"]["isError"] is False
    assert done["createdAt"] == created["createdAt"]
    again = [await client.get(task_id) for _ in range(3)]
    assert all(task == done for task in again)


async def test_cancel_on_another_fastmcp_replica_stops_the_task_for_good(
    fastmcp_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    runner, other = fastmcp_set.replicas[0], fastmcp_set.replicas[1]
    on_runner, on_other = Modern(fresh, runner.url), Modern(fresh, other.url)
    task_id = (await on_runner.call("countdown", {"n": 100_000, "interval_ms": 10}))["taskId"]
    assert (await on_other.get(task_id))["status"] == "working"
    ack = await on_other.task("tasks/cancel", task_id)
    assert ack["result"]["resultType"] == "complete", ack
    cancelled = await on_other.get(task_id)
    assert cancelled["status"] == "cancelled"
    await anyio.sleep(1.0)  # the runner stopped at its next lease renewal; the end stays
    assert await on_runner.get(task_id) == cancelled


async def test_plain_calls_and_unknown_ids_on_fastmcp(
    fastmcp_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    plain = Modern(fresh, fastmcp_set.url, tasks=False)
    result = await plain.call("countdown", {"n": 2, "interval_ms": 0})
    assert result["resultType"] == "complete" and result["content"][0]["text"] == "done 2"
    reply = await plain.task("tasks/get", "A" * 24)
    assert reply["error"]["code"] == -32021, reply
    client = Modern(fresh, fastmcp_set.url)
    assert (await client.task("tasks/get", "A" * 24))["error"]["code"] == -32602
    assert (await client.task("tasks/get", "bad id"))["error"]["code"] == -32602


async def test_listen_on_one_fastmcp_replica_follows_a_task_running_on_another(
    fastmcp_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    await listen_follows_a_task_on_another_replica(fastmcp_set, fresh)


async def test_listen_for_tasks_on_fastmcp_needs_the_extension_and_valid_params(
    fastmcp_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    plain = Modern(fresh, fastmcp_set.url, tasks=False)
    reply = await plain.send(
        "subscriptions/listen", {"notifications": {"taskIds": ["E" * 24]}}, "listen"
    )
    assert reply["error"]["code"] == -32021, reply
    client = Modern(fresh, fastmcp_set.url)
    for bad in ({"notifications": "all"}, {"notifications": {"taskIds": "E" * 24}}):
        reply = await client.send("subscriptions/listen", bad, "listen")
        assert reply["error"]["code"] == -32602, reply


async def test_a_fastmcp_listener_gets_events_published_on_the_store(
    mcp_redis: ServerHandle, fastmcp_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    client = Modern(fresh, fastmcp_set.replicas[0].url)
    body = {
        "jsonrpc": "2.0",
        "id": "tools",
        "method": "subscriptions/listen",
        "params": {"notifications": {"toolsListChanged": True}, "_meta": client.meta},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
    }
    frames: list[dict[str, Any]] = []
    async with ReplayBuffer.from_url(f"{mcp_redis.url}?prefix=ftk:") as buffer:
        publisher = StoreSubscriptionBus()  # another replica's bus, on the same store
        publisher.bind(buffer)
        with anyio.fail_after(20):  # a hang guard
            async with fresh.stream("POST", client.url, json=body, headers=headers) as response:
                assert response.status_code == 200
                async for event in sse_events(response):
                    message = event.message
                    if not message or "method" not in message:
                        continue
                    frames.append(message)
                    if message["method"] == "notifications/subscriptions/acknowledged":
                        await publisher.publish(ToolsListChanged())
                    else:
                        break
    ack, change = frames
    assert ack["params"]["notifications"] == {"toolsListChanged": True}
    assert change["method"] == "notifications/tools/list_changed"
    assert change["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "tools"


async def test_a_fastmcp_runner_killed_mid_task_fails_it_within_the_lease(
    mcp_redis: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    store = f"{mcp_redis.url}?prefix=ftkill:"
    doomed, survivor = (spawn_fastmcp(f"ftkill-{i}", store, tmp_path) for i in range(2))
    try:
        wait_ready([doomed, survivor])
        on_doomed, on_survivor = Modern(fresh, doomed.url), Modern(fresh, survivor.url)
        task_id = (await on_doomed.call("hold", {"seconds": 60}))["taskId"]
        assert (await on_survivor.get(task_id))["status"] == "working"
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(10)
        killed = time.monotonic()
        failed = await on_survivor.wait(task_id, "failed", "completed", "cancelled")
        elapsed = time.monotonic() - killed
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == -32603
        assert "stopped" in failed["error"]["message"]
        # A lapse is judged twice, a lease apart (a stalled store fails no live runner).
        assert elapsed <= 2 * LEASE_SECONDS + 1.0, elapsed
    finally:
        doomed.stop()
        survivor.stop()


async def test_an_idempotent_fastmcp_task_runs_again_on_one_survivor(
    mcp_redis: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    store = f"{mcp_redis.url}?prefix=ftrerun:"
    replicas = [spawn_fastmcp(f"ftrerun-{i}", store, tmp_path) for i in range(3)]
    await rerun_on_a_survivor(replicas, mcp_redis, fresh)

"""Durable tasks over HTTP on the 2026-07-28 revision: real replicas behind a round-robin proxy.

Three example-server processes share one real Redis (and three apps share
``memory://NAME`` in one process); a raw client opens a new connection per
request, so a task is created on one replica and read, answered or cancelled
on the others.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import redis
import redis.asyncio
from mcp_types import CallToolResult

from replaystore.mcp.client.tasks import (
    OnCreatedError,
    TaskCancelledError,
    TaskClient,
    TaskRequestError,
)
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import (
    RawSession,
    spawn_many,
    spawn_replica,
    wait_ready,
)
from tests.mcp.tasks._support import (
    EXTENSION,
    LEASE_SECONDS,
    Modern,
    TaskSet,
    _text,
    listen_follows_a_task_on_another_replica,
    rerun_on_a_survivor,
)

pytestmark = pytest.mark.anyio

TASK_TTL_SECONDS = 6.0


@pytest.fixture(scope="module")
def task_sets(
    mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TaskSet]]:
    """``redis``: three processes on one Redis; ``memory``: three apps on ``memory://NAME``."""
    logs = tmp_path_factory.mktemp("task-replicas")
    store = f"{mcp_redis.url}?prefix=tk:"
    options = ("--lease-seconds", str(LEASE_SECONDS), "--task-ttl", str(TASK_TTL_SECONDS))
    on_redis = [spawn_replica(f"task-replica-{i}", store, logs, *options) for i in range(3)]
    memory = spawn_many(
        "task-memory",
        {f"task-memory-{i}": ("sdk", "memory://tasks", 10_000) for i in range(3)},
        logs,
    )
    everything = [*on_redis, *memory.values()]
    sets: dict[str, TaskSet] = {}
    try:
        wait_ready(everything)
        for name, servers in (("redis", on_redis), ("memory", list(memory.values()))):
            proxy = TcpProxy([("127.0.0.1", s.port) for s in servers]).start()
            sets[name] = TaskSet(name, servers, proxy)
        yield sets
    finally:
        for task_set in sets.values():
            task_set.proxy.stop()
        for server in everything:
            server.stop()


@pytest.fixture(params=["redis", "memory"])
def any_set(request: pytest.FixtureRequest, task_sets: dict[str, TaskSet]) -> TaskSet:
    return task_sets[request.param]


async def test_a_task_created_on_one_replica_resolves_on_every_other(
    any_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    client = Modern(fresh, any_set.url)
    created = await client.call("countdown", {"n": 4, "interval_ms": 150})
    assert created["resultType"] == "task" and created["status"] == "working"
    assert created["ttlMs"] > 0 and created["pollIntervalMs"] > 0
    task_id = created["taskId"]
    seen = [await client.get(task_id) for _ in range(3)]  # the three replicas, at once
    for task in seen:
        assert task["resultType"] == "complete" and task["taskId"] == task_id
        if task["status"] == "working":  # nothing changed: the same lastUpdatedAt
            assert task["lastUpdatedAt"] == created["lastUpdatedAt"]
    done = await client.wait(task_id, "completed")
    assert _text(done) == "done 4" and done["result"]["isError"] is False
    assert done["lastUpdatedAt"] >= created["lastUpdatedAt"]
    assert done["createdAt"] == created["createdAt"]
    again = [await client.get(task_id) for _ in range(3)]
    assert all(task == done for task in again)


async def test_input_requested_in_a_task_is_answered_on_other_replicas(
    any_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    client = Modern(fresh, any_set.url)
    task_id = (await client.call("ask", {"question": "Who?"}))["taskId"]
    waiting = await client.wait(task_id, "input_required")
    [(key, request)] = waiting["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert request["params"]["message"] == "Who?"
    # An unknown key is ignored: the task keeps waiting.
    ack = await client.task("tasks/update", task_id, inputResponses={"nope": {"action": "accept"}})
    assert ack["result"]["resultType"] == "complete"
    await anyio.sleep(0.5)
    still = await client.get(task_id)
    assert still["status"] == "input_required" and key in still["inputRequests"]
    answer = {"action": "accept", "content": {"name": "Luca"}}
    ack = await client.task("tasks/update", task_id, inputResponses={key: answer})
    assert "result" in ack
    done = await client.wait(task_id, "completed")
    assert _text(done) == "hello Luca"
    # Answering the same key again is ignored; the result stays.
    late = {key: {"action": "decline"}}
    assert "result" in await client.task("tasks/update", task_id, inputResponses=late)
    assert await client.get(task_id) == done


async def test_cancel_on_another_replica_stops_the_task_for_good(
    any_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    client = Modern(fresh, any_set.url)
    task_id = (await client.call("countdown", {"n": 100_000, "interval_ms": 10}))["taskId"]
    await client.get(task_id)
    ack = await client.task("tasks/cancel", task_id)
    assert ack["result"]["resultType"] == "complete"
    cancelled = await client.get(task_id)
    assert cancelled["status"] == "cancelled"
    await anyio.sleep(1.0)  # the runner has stopped; nothing it does can overwrite the end
    assert await client.get(task_id) == cancelled
    assert "result" in await client.task("tasks/cancel", task_id)  # known: acknowledged


async def test_a_client_without_the_extension_never_gets_a_task(
    any_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    plain = Modern(fresh, any_set.url, tasks=False)
    result = await plain.call("countdown", {"n": 2, "interval_ms": 0})
    assert result["resultType"] == "complete" and result["content"][0]["text"] == "done 2"
    task_id = (await Modern(fresh, any_set.url).call("countdown", {"n": 1}))["taskId"]
    for method in ("tasks/get", "tasks/cancel"):
        reply = await plain.task(method, task_id)
        assert reply["error"]["code"] == -32021, reply
        assert EXTENSION in str(reply["error"]["data"])


async def test_bad_task_requests_get_json_rpc_errors(
    any_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    client = Modern(fresh, any_set.url)
    unknown = "A" * 24
    for method in ("tasks/get", "tasks/cancel"):
        reply = await client.task(method, unknown)
        assert reply["error"]["code"] == -32602, reply
    reply = await client.task("tasks/update", unknown, inputResponses={})
    assert reply["error"]["code"] == -32602
    assert (await client.task("tasks/get", "x" * 100))["error"]["code"] == -32602
    assert (await client.send("tasks/get", {}, "none"))["error"]["code"] == -32602
    task_id = (await client.call("ask", {}))["taskId"]
    many = {f"k{i}": {"action": "accept"} for i in range(1000)}
    reply = await client.task("tasks/update", task_id, inputResponses=many)
    assert reply["error"]["code"] == -32602
    huge = {"r1": {"action": "accept", "content": {"name": "x" * (2 << 20)}}}
    reply = await client.task("tasks/update", task_id, inputResponses=huge)
    assert reply["error"]["code"] == -32602
    waiting = await client.wait(task_id, "input_required")
    assert "x" * 100 not in str(waiting)
    await client.task("tasks/cancel", task_id)


async def test_the_runner_killed_mid_task_fails_it_within_the_lease(
    mcp_redis: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    store = f"{mcp_redis.url}?prefix=tkill:"
    options = ("--lease-seconds", str(LEASE_SECONDS))
    doomed, survivor = (spawn_replica(f"tkill-{i}", store, tmp_path, *options) for i in range(2))
    try:
        wait_ready([doomed, survivor])
        on_doomed, on_survivor = Modern(fresh, doomed.url), Modern(fresh, survivor.url)
        # ``ask`` is not idempotent: it fails as lost rather than running again.
        task_id = (await on_doomed.call("ask", {}))["taskId"]
        await on_survivor.wait(task_id, "input_required")
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(10)
        killed = time.monotonic()
        failed = await on_survivor.wait(task_id, "failed", "completed", "cancelled")
        elapsed = time.monotonic() - killed
        assert failed["status"] == "failed"
        assert failed["error"]["code"] == -32603
        assert "stopped" in failed["error"]["message"]
        # A lapse is judged twice, a lease apart (a stalled store fails no live runner).
        assert elapsed <= 2 * LEASE_SECONDS + 1.0, elapsed
        assert await on_survivor.get(task_id) == failed
    finally:
        doomed.stop()
        survivor.stop()


async def test_an_idempotent_task_runs_again_on_one_survivor_when_its_runner_is_killed(
    mcp_redis: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    await rerun_on_a_survivor(
        [spawn_replica(f"trerun-{i}", *_rerun_store(mcp_redis, tmp_path)) for i in range(3)],
        mcp_redis,
        fresh,
    )


def _rerun_store(mcp_redis: ServerHandle, tmp_path: Path) -> tuple[str, Path, str, str]:
    return f"{mcp_redis.url}?prefix=trerun:", tmp_path, "--lease-seconds", str(LEASE_SECONDS)


async def test_after_its_ttl_nothing_of_a_task_is_left(
    task_sets: dict[str, TaskSet], mcp_redis: ServerHandle, fresh: httpx.AsyncClient
) -> None:
    client = Modern(fresh, task_sets["redis"].url)
    created = await client.call("ask", {})
    task_id = created["taskId"]
    assert created["ttlMs"] == int(TASK_TTL_SECONDS * 1000)
    await client.wait(task_id, "input_required")
    connection = redis.Redis.from_url(mcp_redis.url)
    try:
        assert connection.keys(f"tk:{{task:*:{task_id}}}*")
        await anyio.sleep(TASK_TTL_SECONDS + 0.5)
        reply = await client.task("tasks/get", task_id)
        assert reply["error"]["code"] == -32602
        assert connection.keys(f"tk:{{task:*:{task_id}}}*") == []
    finally:
        connection.close()


# ---------------------------------------------------------------- the client helper


@pytest.fixture
async def fresh2() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(
        timeout=httpx2.Timeout(15.0), limits=httpx2.Limits(max_keepalive_connections=0)
    ) as client:
        yield client


async def test_the_client_helper_answers_input_through_its_callback(
    any_set: TaskSet, fresh2: httpx2.AsyncClient
) -> None:
    asked: list[tuple[str, str]] = []

    async def on_input(key: str, request: dict[str, Any]) -> dict[str, Any]:
        asked.append((key, request["params"]["message"]))
        return {"action": "accept", "content": {"name": "Ada"}}

    created: list[str] = []

    async def on_created(task_id: str) -> None:
        created.append(task_id)

    async with TaskClient(any_set.url, http=fresh2) as client:
        result = await client.call(
            "ask", {"question": "Name?"}, on_input=on_input, on_created=on_created
        )
    assert result.content[0].text == "hello Ada"
    assert len(created) == 1 and asked == [("r1", "Name?")]  # asked once, however many polls


async def test_the_client_helper_takes_a_plain_on_created_and_never_loses_the_id(
    task_sets: dict[str, TaskSet], fresh2: httpx2.AsyncClient
) -> None:
    """The result is the SDK's ``CallToolResult``; ``on_created`` may be a plain function,
    and one that raises hands the task's id over with its error (the task runs on)."""
    saved: list[str] = []

    def full_disk(task_id: str) -> None:
        raise OSError("no space left on device")

    async with TaskClient(task_sets["redis"].url, http=fresh2) as client:
        result = await client.call("countdown", {"n": 2, "interval_ms": 0}, on_created=saved.append)
        assert isinstance(result, CallToolResult), result
        assert result.content[0].text == "done 2"
        assert result.structured_content == {"result": "done 2"} and not result.is_error
        assert len(saved) == 1 and (await client.get(saved[0]))["status"] == "completed"
        with pytest.raises(OnCreatedError) as caught:
            await client.call("countdown", {"n": 3, "interval_ms": 50}, on_created=full_disk)
        assert isinstance(caught.value.__cause__, OSError)
        assert (await client.wait(caught.value.task_id)).content[0].text == "done 3"


async def test_the_client_helper_resumes_from_a_persisted_task_id(
    any_set: TaskSet, fresh2: httpx2.AsyncClient
) -> None:
    saved: list[str] = []

    async def save(task_id: str) -> None:
        saved.append(task_id)

    # The first client stops polling (its process "restarts") mid-task.
    with anyio.move_on_after(0.3):
        async with TaskClient(any_set.url, http=fresh2) as first:
            await first.call("countdown", {"n": 10, "interval_ms": 100}, on_created=save)
    [task_id] = saved
    async with TaskClient(any_set.url, http=fresh2) as second:
        result = await second.wait(task_id)
        assert result.content[0].text == "done 10"
        # A cancelled task raises, and so does an unknown one.
        doomed = (
            await second.request(
                "tools/call", {"name": "countdown", "arguments": {"n": 10_000}}, "countdown"
            )
        )["taskId"]
        await second.cancel(doomed)
        with pytest.raises(TaskCancelledError):
            await second.wait(doomed)
        with pytest.raises(TaskRequestError) as caught:
            await second.wait("C" * 24)
        assert caught.value.code == -32602


async def test_both_revisions_at_once_on_the_same_replicas(
    any_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    """A 2025-11-25 session resumes exactly while 2026-07-28 tasks run on the same replicas."""
    client = Modern(fresh, any_set.url)
    task_id = (await client.call("countdown", {"n": 5, "interval_ms": 100}))["taskId"]
    legacy = await RawSession(fresh, any_set.url).initialize()
    assert await legacy.run_tool("countdown", {"n": 3, "interval_ms": 0}) == "done 3"
    assert _text(await client.wait(task_id, "completed")) == "done 5"
    assert await legacy.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"


# ---------------------------------------------------------------- listen streams


async def test_listen_on_one_replica_follows_a_task_running_on_another(
    any_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    await listen_follows_a_task_on_another_replica(any_set, fresh)


async def test_listen_for_tasks_needs_the_extension(
    any_set: TaskSet, fresh: httpx.AsyncClient
) -> None:
    plain = Modern(fresh, any_set.url, tasks=False)
    reply = await plain.send(
        "subscriptions/listen", {"notifications": {"taskIds": ["E" * 24]}}, "listen"
    )
    assert reply["error"]["code"] == -32021


async def test_a_replica_stopped_gracefully_fails_its_running_tasks_at_once(
    mcp_redis: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    """A task that cannot run again (``ask``) fails at once when its replica stops.

    (An idempotent tool's task is run again instead: ``tests/mcp/tasks/test_task_drain.py``.)
    """
    store = f"{mcp_redis.url}?prefix=tstop:"
    # A lapsing lease would take 30 s, and no drain: the stop must say it.
    options = ("--lease-seconds", "30", "--drain-seconds", "0.1")
    stopping, survivor = (spawn_replica(f"tstop-{i}", store, tmp_path, *options) for i in range(2))
    try:
        wait_ready([stopping, survivor])
        on_stopping, on_survivor = Modern(fresh, stopping.url), Modern(fresh, survivor.url)
        task_id = (await on_stopping.call("ask", {}))["taskId"]
        await on_survivor.wait(task_id, "input_required")
        stopping.proc.send_signal(signal.SIGTERM)
        stopping.proc.wait(15)
        failed = await on_survivor.get(task_id)
        assert failed["status"] == "failed", failed
        assert "shut down" in failed["error"]["message"]
    finally:
        stopping.stop()
        survivor.stop()

"""Task rules that need a server of their own: required tools, owners, errors, shutdown.

One app in this process (ASGI, no sockets) on a ``memory://`` store; the
rules about replicas are in ``test_tasks.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Context as FastMCPContext
from fastmcp import FastMCP
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from replaystore import ReplayBuffer
from replaystore.mcp import fastmcp_http_app, streamable_http_app
from replaystore.mcp.tasks.extension import ReplayTasks, TaskSupport
from replaystore.taskstore import LOST_ERROR, TaskStore, new_task_id
from replaystore.testing.servers import ServerHandle

pytestmark = pytest.mark.anyio

EXTENSION = "io.modelcontextprotocol/tasks"
_ids = itertools.count(1)
BASE = "http://127.0.0.1:8000"  # a host the SDK's DNS-rebinding check accepts
_finished: list[str] = []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _owner(ctx: Any) -> str | None:
    request = ctx.request
    return None if request is None else request.headers.get("x-user")


@pytest.fixture
async def app_client() -> AsyncIterator[httpx.AsyncClient]:
    tasks = ReplayTasks(
        {
            "needs": "required",
            "slow": TaskSupport("optional", ttl=30),
            "broken": "optional",
            "plain": "forbidden",
        },
        owner=_owner,
        lease=1.0,
        check_interval=0.05,
    )
    server = MCPServer("tasks-test", extensions=[tasks])

    @server.tool()
    async def needs() -> str:
        return "needed"

    @server.tool()
    async def slow(ctx: Context, seconds: float) -> str:
        await ctx.report_progress(1, 2)  # dropped inside a task, never an error
        await anyio.sleep(seconds)
        _finished.append("slow")
        return "slept"

    @server.tool()
    async def broken() -> str:
        raise MCPError(-32000, "upstream refused")

    @server.tool()
    async def plain() -> str:
        return "plain"

    buffer = ReplayBuffer.from_url("memory://")
    app = streamable_http_app(server, buffer, tasks=tasks)
    async with buffer, app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            yield client


async def _send(
    client: httpx.AsyncClient,
    method: str,
    params: dict[str, Any],
    name: str,
    *,
    user: str | None = "alice",
    tasks: bool = True,
) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {EXTENSION: {}} if tasks else {}
        },
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
        "Mcp-Name": name,
    }
    if user is not None:
        headers["x-user"] = user
    body = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {**params, "_meta": meta},
    }
    response = await client.post("/mcp", json=body, headers=headers)
    reply: dict[str, Any] = response.json()
    return reply


async def _call(client: httpx.AsyncClient, tool: str, **kw: Any) -> dict[str, Any]:
    arguments = kw.pop("arguments", {})
    return await _send(client, "tools/call", {"name": tool, "arguments": arguments}, tool, **kw)


async def _get(client: httpx.AsyncClient, task_id: str, **kw: Any) -> dict[str, Any]:
    return await _send(client, "tasks/get", {"taskId": task_id}, task_id, **kw)


async def _until(client: httpx.AsyncClient, task_id: str, status: str) -> dict[str, Any]:
    with anyio.fail_after(10):
        while True:
            reply = await _get(client, task_id)
            if reply["result"]["status"] == status:
                return reply["result"]
            await anyio.sleep(0.02)


async def test_a_required_tool_answers_32021_without_the_extension(
    app_client: httpx.AsyncClient,
) -> None:
    reply = await _call(app_client, "needs", tasks=False)
    assert reply["error"]["code"] == -32021
    assert reply["error"]["data"]["requiredCapabilities"]["extensions"] == {EXTENSION: {}}
    created = (await _call(app_client, "needs"))["result"]
    assert created["resultType"] == "task"
    done = await _until(app_client, created["taskId"], "completed")
    assert done["result"]["content"][0]["text"] == "needed"


async def test_a_forbidden_tool_never_runs_as_a_task(app_client: httpx.AsyncClient) -> None:
    result = (await _call(app_client, "plain"))["result"]
    assert result["resultType"] == "complete" and result["content"][0]["text"] == "plain"


async def test_a_per_tool_ttl(app_client: httpx.AsyncClient) -> None:
    created = (await _call(app_client, "slow", arguments={"seconds": 0}))["result"]
    assert created["ttlMs"] == 30_000
    created = (await _call(app_client, "broken"))["result"]
    assert created["ttlMs"] == 3_600_000


async def test_a_json_rpc_error_fails_the_task_with_it(app_client: httpx.AsyncClient) -> None:
    task_id = (await _call(app_client, "broken"))["result"]["taskId"]
    failed = await _until(app_client, task_id, "failed")
    assert failed["error"] == {"code": -32000, "message": "upstream refused"}
    assert "result" not in failed


async def test_a_task_is_visible_to_its_owner_only(app_client: httpx.AsyncClient) -> None:
    task_id = (await _call(app_client, "slow", arguments={"seconds": 5}))["result"]["taskId"]
    assert "result" in await _get(app_client, task_id)
    unknown = await _get(app_client, "B" * 24, user="mallory")
    for user in ("mallory", None):
        reply = await _get(app_client, task_id, user=user)
        assert reply["error"] == unknown["error"]  # the same answer as an unknown id
        cancel = await _send(app_client, "tasks/cancel", {"taskId": task_id}, task_id, user=user)
        assert cancel["error"]["code"] == -32602
    assert (await _get(app_client, task_id))["result"]["status"] == "working"
    await _send(app_client, "tasks/cancel", {"taskId": task_id}, task_id)
    assert (await _get(app_client, task_id))["result"]["status"] == "cancelled"


async def test_a_cancelled_tool_stops_and_its_late_result_is_dropped(
    app_client: httpx.AsyncClient,
) -> None:
    _finished.clear()
    task_id = (await _call(app_client, "slow", arguments={"seconds": 0.5}))["result"]["taskId"]
    await _send(app_client, "tasks/cancel", {"taskId": task_id}, task_id)
    await anyio.sleep(0.8)
    assert _finished == []  # the tool was stopped where it ran
    assert (await _get(app_client, task_id))["result"]["status"] == "cancelled"


async def test_shutdown_fails_the_tasks_still_running() -> None:
    tasks = ReplayTasks({"slow": "optional"}, lease=30.0)
    server = MCPServer("tasks-shutdown", extensions=[tasks])

    @server.tool()
    async def slow() -> str:
        await anyio.sleep(60)
        return "never"

    buffer = ReplayBuffer.from_url("memory://shutdown-test")
    app = streamable_http_app(server, buffer, tasks=tasks)
    async with buffer:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
                task_id = (await _call(client, "slow"))["result"]["taskId"]
        record = await tasks.store.get(task_id)
        assert record is not None and record.status == "failed"
        assert record.error is not None and "shut down" in record.error["message"]


# ---------------------------------------------------------------- the background scan


class _Name(BaseModel):
    name: str


class _Unit(BaseModel):
    unit: str


def _stored_status(store: TaskStore, task_id: str) -> str | None:
    """The status a ``memory://`` store holds, looked at without applying the lapse rule."""
    task = store._shared.tasks.get(task_id)  # type: ignore[attr-defined]
    return None if task is None else str(task.status)


async def _orphans(store: TaskStore, call: dict[str, Any]) -> tuple[str, str]:
    """Two tasks of a replica that died at once: their runner never renews its lease."""
    lost, rerun = new_task_id(), new_task_id()
    await store.create(lost, runner="gone", lease=0.2, ttl_ms=60_000)
    await store.create(rerun, runner="gone", lease=0.2, ttl_ms=60_000, attempts=2, call=call)
    return lost, rerun


async def _stored(store: TaskStore, *wanted: tuple[str, str]) -> None:
    with anyio.fail_after(10):  # a hang guard
        while any(_stored_status(store, task_id) != status for task_id, status in wanted):  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def test_orphans_nobody_reads_end_or_run_again_in_the_background() -> None:
    """On ``memory://``, with no client reading: the scan fails one orphan and runs the
    idempotent one again here, with the server's lifespan state and its input requests."""
    tasks = ReplayTasks(
        # The runner here renews its lease every 50 ms; 2 s tolerates a slow first call.
        {"greet": TaskSupport("optional", idempotent=True)},
        lease=2.0,
        check_interval=0.05,
    )

    @asynccontextmanager
    async def lifespan(_server: MCPServer) -> AsyncIterator[dict[str, str]]:
        yield {"greeting": "hello"}

    server = MCPServer("tasks-reaper", extensions=[tasks], lifespan=lifespan)

    @server.tool()
    async def greet(ctx: Context, punctuation: str) -> str:
        answer = await ctx.elicit("Name?", _Name)
        assert answer.action == "accept"
        greeting = ctx.request_context.lifespan_context["greeting"]
        return f"{greeting} {answer.data.name}{punctuation}"

    buffer = ReplayBuffer.from_url("memory://reaper-test")
    app = streamable_http_app(server, buffer, tasks=tasks)
    async with buffer, app.router.lifespan_context(app):
        store = tasks.store
        call = {"name": "greet", "arguments": {"punctuation": "!"}}
        lost, rerun = await _orphans(store, call)
        await _stored(store, (lost, "failed"), (rerun, "input_required"))
        record = await store.get(rerun)
        assert record is not None
        [(key, request)] = record.input_requests.items()
        assert request["params"]["message"] == "Name?"
        await store.respond(rerun, {key: {"action": "accept", "content": {"name": "Ada"}}})
        await _stored(store, (rerun, "completed"))
        done = await store.get(rerun)
        assert done is not None and done.result is not None
        assert done.result["content"][0]["text"] == "hello Ada!"
        failed = await store.get(lost)
        assert failed is not None and failed.error == LOST_ERROR


async def test_on_fastmcp_orphans_nobody_reads_run_again_in_the_background() -> None:
    tasks = ReplayTasks(
        {"count": TaskSupport("optional", idempotent=True)}, lease=2.0, check_interval=0.05
    )
    server = FastMCP("tasks-reaper-fastmcp")

    @server.tool
    async def count(ctx: FastMCPContext, n: int) -> str:
        answer = await ctx.elicit("Unit?", _Unit)
        assert answer.action == "accept"
        return f"counted {n} {answer.data.unit}"  # type: ignore[union-attr]

    buffer = ReplayBuffer.from_url("memory://reaper-fastmcp-test")
    app = fastmcp_http_app(server, buffer, tasks=tasks)
    async with buffer, app.router.lifespan_context(app):
        store = tasks.store
        lost, rerun = await _orphans(store, {"name": "count", "arguments": {"n": 3}})
        await _stored(store, (lost, "failed"), (rerun, "input_required"))
        record = await store.get(rerun)
        assert record is not None
        [(key, request)] = record.input_requests.items()
        assert request["params"]["message"] == "Unit?"
        await store.respond(rerun, {key: {"action": "accept", "content": {"unit": "apples"}}})
        await _stored(store, (rerun, "completed"))
        done = await store.get(rerun)
        assert done is not None and done.result is not None
        assert done.result["content"][0]["text"] == "counted 3 apples"


# ---------------------------------------------------------------- nudges


@pytest.fixture(params=["memory", "redis"])
def shared_store_url(request: pytest.FixtureRequest, mcp_redis: ServerHandle) -> str:
    """A store two apps of this process share: ``memory://NAME``, or a real Redis."""
    tag = new_task_id()[:12]
    if request.param == "memory":
        return f"memory://nudge-{tag}"
    return f"{mcp_redis.url}?prefix=nudge-{tag}:"


async def test_an_answer_or_cancel_on_another_replica_reaches_the_tool_at_once(
    shared_store_url: str,
) -> None:
    """With renewals every 20 s, only the nudge can bring the answer, or the cancel, sooner."""
    stopped: list[str] = []

    def replica() -> tuple[ReplayTasks, Any, ReplayBuffer]:
        tasks = ReplayTasks({"greet": "optional", "wait": "optional"}, lease=60, check_interval=20)
        server = MCPServer("nudged", extensions=[tasks])  # replicas of one app: one name

        @server.tool()
        async def greet(ctx: Context) -> str:
            answer = await ctx.elicit("Name?", _Name)
            return f"hello {answer.data.name if answer.action == 'accept' else '?'}"

        @server.tool()
        async def wait() -> str:
            try:
                await anyio.sleep(60)
            finally:
                stopped.append("wait")
            return "never"

        buffer = ReplayBuffer.from_url(shared_store_url)
        return tasks, streamable_http_app(server, buffer, tasks=tasks), buffer

    _, runner_app, runner_buffer = replica()
    _, other_app, other_buffer = replica()
    async with (
        runner_buffer,
        other_buffer,
        runner_app.router.lifespan_context(runner_app),
        other_app.router.lifespan_context(other_app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=runner_app), base_url=BASE) as runs,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=other_app), base_url=BASE) as other,
    ):
        task_id = (await _call(runs, "greet"))["result"]["taskId"]
        waiting = await _until(other, task_id, "input_required")
        [key] = waiting["inputRequests"]
        answer = {key: {"action": "accept", "content": {"name": "Ada"}}}
        await _send(other, "tasks/update", {"taskId": task_id, "inputResponses": answer}, task_id)
        with anyio.fail_after(5):  # the next renewal is 20 s away
            done = await _until(other, task_id, "completed")
        assert done["result"]["content"][0]["text"] == "hello Ada"

        task_id = (await _call(runs, "wait"))["result"]["taskId"]
        await _send(other, "tasks/cancel", {"taskId": task_id}, task_id)
        with anyio.fail_after(5):
            while not stopped:  # noqa: ASYNC110 - the tool's own record, polled
                await anyio.sleep(0.02)
        assert (await _get(other, task_id))["result"]["status"] == "cancelled"

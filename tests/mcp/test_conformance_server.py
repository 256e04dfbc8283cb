"""``examples/conformance_server.py`` does what the conformance suite's scenarios ask of it.

The suite itself needs the network (``scripts/conformance`` installs it);
these tests check the fixture server's own behaviour, in process (ASGI, no
sockets) on ``memory://``: every fixture is listed, the tasks fixtures run
as the scenarios' descriptions say, and the tasks extension's routing
header is checked. Also the example server's ``ask`` on 2026-07-28 without
the extension: an ``InputRequiredResult``, completed on another replica.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import pytest

from replaystore.mcp.example import build_app as build_example
from replaystore.testing.servers import ServerHandle

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conformance_server.py"
EXTENSION = "io.modelcontextprotocol/tasks"
BASE = "http://127.0.0.1:8000"  # a host the SDK's DNS-rebinding check accepts
_ids = itertools.count(1)

#: Every tool a server scenario of the suite calls (2025-11-25, 2026-07-28, tasks).
FIXTURES = {
    "test_simple_text", "test_image_content", "test_audio_content", "test_embedded_resource",
    "test_multiple_content_types", "test_error_handling", "test_tool_with_logging",
    "test_tool_with_progress", "test_sampling", "test_elicitation",
    "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums",
    "test_missing_capability", "test_x_mcp_header", "json_schema_2020_12_tool",
    "test_reconnection", "test_trigger_tool_change", "test_trigger_prompt_change",
    "test_input_required_result_elicitation", "test_input_required_result_sampling",
    "test_input_required_result_list_roots", "test_input_required_result_request_state",
    "test_input_required_result_multiple_inputs", "test_input_required_result_multi_round",
    "test_input_required_result_tampered_state", "test_input_required_result_capabilities",
    "greet", "slow_compute", "failing_job", "protocol_error_job", "confirm_delete",
    "multi_input", "test_tool_with_task",
}  # fmt: skip


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url=BASE, timeout=10) as client,
    ):
        yield client


def _example() -> ModuleType:
    """The example as a module (its tools' type hints resolve in its own globals)."""
    name = "conformance_server_example"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@asynccontextmanager
async def conformance_server() -> AsyncIterator[httpx.AsyncClient]:
    app = _example().build_app(f"memory://conformance-{uuid.uuid4().hex[:8]}")
    async with serving(app) as client:
        yield client


async def send(
    client: httpx.AsyncClient,
    method: str,
    params: dict[str, Any],
    *,
    extension: bool = True,
    name: str | None = None,
) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"elicitation": {}, "sampling": {}}
    if extension:
        capabilities["extensions"] = {EXTENSION: {}}
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
    }
    routed = name if name is not None else params.get("name") or params.get("taskId")
    if routed:
        headers["Mcp-Name"] = str(routed)
    body = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {**params, "_meta": meta},
    }
    response = await client.post("/mcp", json=body, headers=headers)
    reply: dict[str, Any] = response.json()
    reply["http_status"] = response.status_code
    return reply


async def call(client: httpx.AsyncClient, tool: str, **params: Any) -> dict[str, Any]:
    arguments = params.pop("arguments", {})
    return await send(client, "tools/call", {"name": tool, "arguments": arguments, **params})


async def until(client: httpx.AsyncClient, task_id: str, *statuses: str) -> dict[str, Any]:
    with anyio.fail_after(10):
        while True:
            result: dict[str, Any] = (await send(client, "tasks/get", {"taskId": task_id}))[
                "result"
            ]
            if result["status"] in statuses:
                return result
            await anyio.sleep(0.02)


async def until_pending(client: httpx.AsyncClient, task_id: str, count: int) -> dict[str, Any]:
    """The task's input requests, once exactly ``count`` are outstanding."""
    with anyio.fail_after(10):
        while True:
            result = await until(client, task_id, "input_required")
            requests: dict[str, Any] = result["inputRequests"]
            if len(requests) == count:
                return requests
            await anyio.sleep(0.02)


async def answer_input(client: httpx.AsyncClient, task_id: str, answers: dict[str, Any]) -> None:
    reply = await send(client, "tasks/update", {"taskId": task_id, "inputResponses": answers})
    assert reply["result"]["resultType"] == "complete" and "status" not in reply["result"]


def text(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


async def test_every_fixture_of_the_suite_is_listed() -> None:
    async with conformance_server() as client:
        tools = (await send(client, "tools/list", {}))["result"]["tools"]
    assert {tool["name"] for tool in tools} >= FIXTURES


async def test_the_tasks_fixtures_end_as_the_scenarios_expect() -> None:
    async with conformance_server() as client:
        greeting = (await call(client, "greet", arguments={"name": "World"}))["result"]
        assert greeting["resultType"] == "complete" and text(greeting) == "Hello, World!"

        created = (await call(client, "slow_compute", arguments={"seconds": 0}))["result"]
        assert created["resultType"] == "task"
        done = await until(client, created["taskId"], "completed")
        assert "computed" in text(done["result"])

        running = (await call(client, "slow_compute", arguments={"seconds": 5}))["result"]
        ack = (await send(client, "tasks/cancel", {"taskId": running["taskId"]}))["result"]
        assert ack["resultType"] == "complete" and "taskId" not in ack
        assert (await until(client, running["taskId"], "cancelled"))["status"] == "cancelled"

        failing = (await call(client, "failing_job"))["result"]
        failed_tool = await until(client, failing["taskId"], "completed", "failed")
        assert failed_tool["status"] == "completed" and failed_tool["result"]["isError"] is True

        broken = (await call(client, "protocol_error_job"))["result"]
        failed = await until(client, broken["taskId"], "completed", "failed")
        assert failed["status"] == "failed" and "result" not in failed
        assert failed["error"]["code"] == -32603

        # Without the extension: optional tools run plainly, required ones answer -32021.
        plain = await send(
            client,
            "tools/call",
            {"name": "slow_compute", "arguments": {"seconds": 0}},
            extension=False,
        )
        assert plain["result"]["resultType"] == "complete"
        refused = await send(
            client, "tools/call", {"name": "failing_job", "arguments": {}}, extension=False
        )
        assert refused["error"]["code"] == -32021


async def test_input_on_the_tasks_surface() -> None:
    async with conformance_server() as client:
        task = (await call(client, "confirm_delete"))["result"]
        waiting = await until(client, task["taskId"], "input_required")
        (key,) = waiting["inputRequests"]
        await answer_input(
            client, task["taskId"], {key: {"action": "accept", "content": {"confirm": True}}}
        )
        done = await until(client, task["taskId"], "completed")
        assert text(done["result"]) == "deleted the item"

        both = (await call(client, "multi_input"))["result"]
        pending = await until_pending(client, both["taskId"], 2)
        first, second = sorted(pending)
        named = {"action": "accept", "content": {"name": "Ada"}}
        await answer_input(client, both["taskId"], {first: named})
        assert set(await until_pending(client, both["taskId"], 1)) == {second}
        await answer_input(client, both["taskId"], {second: named})
        done = await until(client, both["taskId"], "completed")
        assert text(done["result"]) == "first=Ada second=Ada"


async def test_a_multi_round_call_that_becomes_a_task() -> None:
    async with conformance_server() as client:
        first = (await call(client, "test_tool_with_task"))["result"]
        assert first["resultType"] == "input_required" and "taskId" not in first
        assert set(first["inputRequests"]) == {"user_name"}
        answer = {"user_name": {"action": "accept", "content": {"name": "Grace"}}}
        second = (
            await call(
                client,
                "test_tool_with_task",
                inputResponses=answer,
                requestState=first["requestState"],
            )
        )["result"]
        assert second["resultType"] == "task" and "requestState" not in second
        done = await until(client, second["taskId"], "completed")
        assert "Grace" in text(done["result"])


async def test_a_task_request_naming_another_task_in_its_header_is_refused() -> None:
    async with conformance_server() as client:
        task = (await call(client, "slow_compute", arguments={"seconds": 0}))["result"]
        wrong = await send(client, "tasks/get", {"taskId": task["taskId"]}, name="another-task")
        assert wrong["error"]["code"] == -32020 and wrong["http_status"] == 400
        unnamed = await send(client, "tasks/get", {"taskId": task["taskId"]}, name="")
        assert unnamed["result"]["taskId"] == task["taskId"]


async def test_example_ask_without_the_extension_asks_through_an_input_required_result(
    mcp_redis: ServerHandle,
) -> None:
    """2026-07-28 without the tasks extension: the question comes back, the retry answers it.

    Two replicas of the example server on one Redis: the first round on one,
    the retried request (with the answer) on the other.
    """
    url = f"{mcp_redis.url}?prefix=ask-{uuid.uuid4().hex[:8]}:"
    async with (
        serving(build_example(url)) as first,
        serving(build_example(url)) as second,
    ):
        asked = (
            await send(first, "tools/call", {"name": "ask", "arguments": {}}, extension=False)
        )["result"]
        assert asked["resultType"] == "input_required"
        (key,) = asked["inputRequests"]
        assert asked["inputRequests"][key]["method"] == "elicitation/create"
        answer = {key: {"action": "accept", "content": {"name": "Ada"}}}
        params = {"name": "ask", "arguments": {}, "inputResponses": answer}
        if "requestState" in asked:
            params["requestState"] = asked["requestState"]
        done = (await send(second, "tools/call", params, extension=False))["result"]
        assert text(done) == "hello Ada"

        # With the extension, the same tool runs as a task.
        created = (await send(first, "tools/call", {"name": "ask", "arguments": {}}))["result"]
        assert created["resultType"] == "task"

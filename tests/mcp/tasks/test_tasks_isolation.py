"""Whose task is it: apps sharing one store, principals of different issuers, undefined tools.

In-process apps (ASGI, no sockets) on the real Redis of the test session, with
the default key prefix, as two applications configured by their defaults
would share a Redis.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import FastMCP
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer

from replaystore import ReplayBuffer
from replaystore.mcp import fastmcp_http_app, streamable_http_app
from replaystore.mcp.tasks.extension import ReplayTasks, TaskSupport
from replaystore.taskstore import new_task_id
from replaystore.testing.servers import ServerHandle

pytestmark = pytest.mark.anyio

EXTENSION = "io.modelcontextprotocol/tasks"
BASE = "http://127.0.0.1:8000"  # a host the SDK's DNS-rebinding check accepts
_ids = itertools.count(1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _send(
    client: httpx.AsyncClient,
    method: str,
    params: dict[str, Any],
    *,
    token: str | None = None,
) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
    }
    name = str(params.get("name") or params.get("taskId") or "")
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
        "Mcp-Name": name,
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    params = {**params, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}
    response = await client.post("/mcp", json=body, headers=headers)
    reply: dict[str, Any] = response.json()
    return reply


async def _get(client: httpx.AsyncClient, task_id: str, **kw: Any) -> dict[str, Any]:
    return await _send(client, "tasks/get", {"taskId": task_id}, **kw)


async def _until(client: httpx.AsyncClient, task_id: str, status: str) -> dict[str, Any]:
    with anyio.fail_after(10):
        while True:
            reply = await _get(client, task_id)
            result: dict[str, Any] = reply["result"]
            if result["status"] == status:
                return result
            await anyio.sleep(0.02)


@asynccontextmanager
async def _serving(app: Any, buffer: ReplayBuffer) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        buffer,
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client,
    ):
        yield client


def _not_found(reply: dict[str, Any]) -> bool:
    return bool(reply.get("error", {}).get("code") == -32602)


async def test_apps_sharing_one_redis_never_answer_claim_or_fail_each_others_tasks(
    mcp_redis: ServerHandle,
) -> None:
    """Two apps of different names, both with defaults, on one Redis and prefix.

    A task of the first app whose runner died (an idempotent ``countdown``)
    is left alone by the second, which serves no ``countdown``: its reads get
    -32602 and its background scan neither claims nor fails it. Once a replica
    of the first app runs, that one runs it again to its end.
    """
    tag = new_task_id()[:8]

    def billing() -> tuple[ReplayTasks, Any, ReplayBuffer]:
        tasks = ReplayTasks(
            {"countdown": TaskSupport("optional", idempotent=True)}, lease=1.0, check_interval=0.05
        )
        server = MCPServer(f"billing-{tag}", extensions=[tasks])

        @server.tool()
        async def countdown(n: int) -> str:
            return f"done {n}"

        buffer = ReplayBuffer.from_url(mcp_redis.url)
        return tasks, streamable_http_app(server, buffer, tasks=tasks), buffer

    search_tasks = ReplayTasks({"lookup": "optional"}, lease=1.0, check_interval=0.05)
    search = MCPServer(f"search-{tag}", extensions=[search_tasks])

    @search.tool()
    async def lookup(q: str) -> str:
        return f"found {q}"

    search_buffer = ReplayBuffer.from_url(mcp_redis.url)
    search_app = streamable_http_app(search, search_buffer, tasks=search_tasks)
    billing_tasks, billing_app, billing_buffer = billing()
    assert billing_tasks.namespace != search_tasks.namespace

    async with _serving(search_app, search_buffer) as other:
        # A billing replica created this task, then died: its lease lapses unrenewed.
        orphan = new_task_id()
        async with billing_buffer:
            await billing_tasks.store.create(
                orphan,
                runner="gone",
                lease=0.2,
                ttl_ms=60_000,
                attempts=3,
                call={"name": "countdown", "arguments": {"n": 2}},
            )
            # A first look after the lapse marks it suspect; one more lease, and it is judged.
            await anyio.sleep(0.3)
            await billing_tasks.store.get(orphan)
        mine = (await _send(other, "tools/call", {"name": "lookup", "arguments": {"q": "x"}}))[
            "result"
        ]["taskId"]
        await anyio.sleep(0.3)  # the orphan's lease has lapsed
        assert _not_found(await _get(other, orphan))
        assert _not_found(await _send(other, "tasks/cancel", {"taskId": orphan}))
        await anyio.sleep(2.5)  # two scans of the search app, which must leave it alone
        billing_tasks, billing_app, billing_buffer = billing()
        async with _serving(billing_app, billing_buffer) as owner:
            stored = await billing_tasks.store.get(orphan)
            assert stored is not None and stored.status == "working" and stored.rerun
            done = await _until(owner, orphan, "completed")
            assert done["result"]["content"][0]["text"] == "done 2"
            assert _not_found(await _get(owner, mine))  # and the other way round
        assert (await _until(other, mine, "completed"))["result"]["content"][0]["text"] == (
            "found x"
        )


async def test_a_replica_never_claims_a_task_of_a_tool_it_does_not_serve(
    mcp_redis: ServerHandle,
) -> None:
    """Two apps of one name (one namespace) on one Redis, serving different tools.

    A task of ``countdown`` (idempotent) whose runner died is left alone by
    the replica that serves only ``lookup``: it reads the task (same
    namespace) but neither claims nor fails it while a replica serving
    ``countdown`` may still come, and that one runs it again to its end. A
    task of a tool no replica serves any more ends failed as lost once its
    lease has been lapsed for a few leases, not at its TTL.
    """
    name = f"shop-{new_task_id()[:8]}"
    lease = 1.0

    def shop(tools: str) -> tuple[ReplayTasks, Any, ReplayBuffer]:
        tasks = ReplayTasks(
            {tools: TaskSupport("optional", idempotent=True)}, lease=lease, check_interval=0.05
        )
        server = MCPServer(name, extensions=[tasks])
        if tools == "countdown":

            @server.tool()
            async def countdown(n: int) -> str:
                return f"done {n}"
        else:

            @server.tool()
            async def lookup(q: str) -> str:
                return f"found {q}"

        buffer = ReplayBuffer.from_url(mcp_redis.url)
        return tasks, streamable_http_app(server, buffer, tasks=tasks), buffer

    lookup_tasks, lookup_app, lookup_buffer = shop("lookup")
    counting_tasks, counting_app, counting_buffer = shop("countdown")
    assert lookup_tasks.namespace == counting_tasks.namespace == name
    orphan, retired = new_task_id(), new_task_id()
    async with _serving(lookup_app, lookup_buffer) as other:
        for task_id, tool in ((orphan, "countdown"), (retired, "retired")):
            await lookup_tasks.store.create(
                task_id,
                runner="gone",
                lease=0.2,
                ttl_ms=60_000,
                attempts=3,
                call={"name": tool, "arguments": {"n": 2}},
            )
        await anyio.sleep(0.3)  # both leases lapsed
        seen = (await _get(other, orphan))["result"]
        assert seen["status"] == "working", seen
        await anyio.sleep(lease)  # a scan of the lookup replica, which must leave it
        stored = await lookup_tasks.store.get(orphan)
        assert stored is not None and stored.status == "working" and stored.rerun
        async with _serving(counting_app, counting_buffer) as owner:
            done = await _until(owner, orphan, "completed")
            assert done["result"]["content"][0]["text"] == "done 2"
        # Nobody serves "retired": the lookup replica ends it, as lost, after the grace.
        with anyio.fail_after(10 * lease):
            while True:
                ended = await lookup_tasks.store.get(retired)
                assert ended is not None
                if ended.terminal:
                    break
                await anyio.sleep(0.1)
        assert ended.status == "failed"
        assert ended.error is not None and "stopped" in ended.error["message"]


async def test_replicas_of_one_app_share_tasks_by_name_or_by_namespace() -> None:
    """The namespace is the server's name unless given: what decides which replicas share."""
    url = f"memory://isolation-{new_task_id()[:8]}"
    named = ReplayTasks({"t": "optional"})
    same = ReplayTasks({"t": "optional"})
    given = ReplayTasks({"t": "optional"}, namespace="deploy-b")
    buffers = []  # a memory:// store lives as long as a buffer naming it
    for tasks, name in ((named, "app"), (same, "app"), (given, "app")):
        server = MCPServer(name, extensions=[tasks])

        @server.tool()
        async def t() -> str:
            return "t"

        buffers.append(ReplayBuffer.from_url(url))
        tasks.bind(buffers[-1], server)
    assert (named.namespace, same.namespace, given.namespace) == ("app", "app", "deploy-b")
    task_id = new_task_id()
    await named.store.create(task_id, runner="r", lease=5, ttl_ms=10_000)
    assert await same.store.get(task_id) is not None
    assert await given.store.get(task_id) is None


# ---------------------------------------------------------------- owners


class _Tokens:
    """Bearer tokens of two issuers that both know a client ``app`` and a subject ``ada``."""

    async def verify_token(self, token: str) -> AccessToken | None:
        issuer = {"one": "https://id.one.example", "two": "https://id.two.example"}.get(token)
        if issuer is None:
            return None
        return AccessToken(
            token=token, client_id="app", scopes=[], subject="ada", claims={"iss": issuer}
        )


async def test_a_task_belongs_to_its_issuers_principal_not_to_a_lookalike() -> None:
    """Same client id and subject, another issuer: another principal, as for sessions."""
    tasks = ReplayTasks({"hold": "optional"}, lease=2.0, check_interval=0.05)
    auth = AuthSettings(
        issuer_url="https://id.one.example",  # type: ignore[arg-type]
        resource_server_url="http://127.0.0.1:8000/mcp",  # type: ignore[arg-type]
        validate_token_resource=False,
    )
    server = MCPServer("owned", extensions=[tasks], token_verifier=_Tokens(), auth=auth)

    @server.tool()
    async def hold() -> str:
        await anyio.sleep(30)
        return "held"

    buffer = ReplayBuffer.from_url("memory://")
    app = streamable_http_app(server, buffer, tasks=tasks)
    async with _serving(app, buffer) as client:
        created = await _send(client, "tools/call", {"name": "hold", "arguments": {}}, token="one")
        task_id = created["result"]["taskId"]
        assert _not_found(await _get(client, task_id, token="two"))
        assert _not_found(await _send(client, "tasks/cancel", {"taskId": task_id}, token="two"))
        mine = await _get(client, task_id, token="one")
        assert mine["result"]["status"] == "working"
        await _send(client, "tasks/cancel", {"taskId": task_id}, token="one")
        assert (await _get(client, task_id, token="one"))["result"]["status"] == "cancelled"


# ---------------------------------------------------------------- undefined task tools


async def test_a_task_tool_the_server_does_not_define_stops_the_app_from_starting() -> None:
    tasks = ReplayTasks({"report": "optional", "migrate": TaskSupport("required", ttl=86400)})
    server = MCPServer("demo", extensions=[tasks])

    @server.tool()
    async def report(days: int) -> str:
        return f"report over {days} days"

    buffer = ReplayBuffer.from_url("memory://")
    app = streamable_http_app(server, buffer, tasks=tasks)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(buffer)
        with pytest.raises(ValueError, match="does not define: migrate"):
            await stack.enter_async_context(app.router.lifespan_context(app))


async def test_on_fastmcp_an_undefined_task_tool_is_refused_and_mounted_tools_count() -> None:
    child = FastMCP("child")

    @child.tool
    async def sync() -> str:
        return "synced"

    def app(names: list[str]) -> tuple[Any, ReplayBuffer]:
        server = FastMCP("demo")
        server.mount(child, namespace="kid")
        buffer = ReplayBuffer.from_url("memory://")
        tasks = ReplayTasks(dict.fromkeys(names, "optional"))
        return fastmcp_http_app(server, buffer, tasks=tasks), buffer

    good, buffer = app(["kid_sync"])
    async with _serving(good, buffer):
        pass
    bad, buffer = app(["kid_sync", "migrate"])
    async with buffer:
        with pytest.raises(ValueError, match="does not define: migrate"):
            await bad.router.lifespan_context(bad).__aenter__()

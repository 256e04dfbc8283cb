"""``tasks/stream`` (task event streams) served by one app in this process, SDK and FastMCP.

Exact replay from a cursor, ``events_gone`` below the retained range, -32602
for a bad cursor, the same error as ``tasks/get`` for a task one may not see,
the capability, a refused unprefixed type, and the early ends: a draining
replica's stream ends without a result, a store that fails answers 503. The
replicas' case (a stream on a replica that does not run the task) is in
``test_task_streams.py``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import Context as FastMCPContext
from fastmcp import FastMCP
from mcp.server.mcpserver import Context, MCPServer

from replaystore import ReplayBuffer
from replaystore.backends.memory.tasks import MemoryTaskStore
from replaystore.errors import StorageError
from replaystore.mcp import fastmcp_http_app, streamable_http_app
from replaystore.mcp.tasks import EventRetention, ReplayTasks, TaskEventError, emit_event
from replaystore.taskstore import EventPage

pytestmark = pytest.mark.anyio

EXTENSION = "io.modelcontextprotocol/tasks"
BASE = "http://127.0.0.1:8000"
_ids = itertools.count(1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _owner(ctx: Any) -> str | None:
    request = ctx.request
    return None if request is None else request.headers.get("x-user")


class Gate:
    """Holds a task tool until released (a fresh one per app)."""

    def __init__(self) -> None:
        self.open = anyio.Event()


async def _steps(ctx: Any, n: int, hold: bool, gate: Gate) -> str:
    for i in range(n):
        await emit_event(ctx, "com.example/step", {"n": i})
    if hold:
        await gate.open.wait()
        await emit_event(ctx, "com.example/step", {"n": n})
    return "done"


async def _bare(ctx: Any) -> str:
    try:
        await emit_event(ctx, "step", {})
    except TaskEventError as exc:
        return str(exc)
    return "stored"


class _LostReplies(MemoryTaskStore):
    """Stores each of the first appends, then loses its reply (the store said nothing)."""

    lost = 0

    async def emit(self, task_id: str, runner: str, blob: bytes, *, key: str = "") -> int | None:
        seq = await super().emit(task_id, runner, blob, key=key)
        if self.lost < 2:
            self.lost += 1
            raise StorageError("the reply was lost")
        return seq


class _Outage(MemoryTaskStore):
    async def events(self, *args: Any, **kwargs: Any) -> EventPage | None:
        raise StorageError("the store is down")


def _sdk_app(tasks: ReplayTasks, gate: Gate, buffer: ReplayBuffer, **options: Any) -> Any:
    server = MCPServer("streams-test", extensions=[tasks])

    @server.tool()
    async def steps(ctx: Context, n: int, hold: bool = False) -> str:
        return await _steps(ctx, n, hold, gate)

    @server.tool()
    async def bare(ctx: Context) -> str:
        return await _bare(ctx)

    @server.tool()
    async def report(ctx: Context) -> str:
        await ctx.report_progress(1, 2, "half")
        await ctx.report_progress(2)
        return "reported"

    return streamable_http_app(server, buffer, tasks=tasks, **options)


def _fastmcp_app(tasks: ReplayTasks, gate: Gate, buffer: ReplayBuffer, **options: Any) -> Any:
    server = FastMCP("streams-test")

    @server.tool()
    async def steps(ctx: FastMCPContext, n: int, hold: bool = False) -> str:
        return await _steps(ctx, n, hold, gate)

    @server.tool()
    async def bare(ctx: FastMCPContext) -> str:
        return await _bare(ctx)

    @server.tool()
    async def report() -> str:  # progress is checked on the SDK's tools
        return "reported"

    return fastmcp_http_app(server, buffer, tasks=tasks, **options)


class App:
    def __init__(self, client: httpx.AsyncClient, tasks: ReplayTasks, gate: Gate) -> None:
        self.client = client
        self.tasks = tasks
        self.gate = gate

    async def send(
        self, method: str, params: dict[str, Any], name: str, *, user: str | None = "alice"
    ) -> httpx.Response:
        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
        }
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": method,
            "Mcp-Name": name,
        }
        if user is not None:
            headers["x-user"] = user
        body = {"jsonrpc": "2.0", "id": next(_ids), "method": method,
                "params": {**params, "_meta": meta}}  # fmt: skip
        return await self.client.post("/mcp", json=body, headers=headers)

    async def task(self, tool: str, **arguments: Any) -> str:
        reply = (await self.send("tools/call", {"name": tool, "arguments": arguments}, tool)).json()
        task_id: str = reply["result"]["taskId"]
        return task_id

    async def get(self, task_id: str, **kw: Any) -> dict[str, Any]:
        reply: dict[str, Any] = (
            await self.send("tasks/get", {"taskId": task_id}, task_id, **kw)
        ).json()
        return reply

    async def until(self, task_id: str, status: str) -> dict[str, Any]:
        with anyio.fail_after(10):
            while True:
                reply = await self.get(task_id)
                if reply["result"]["status"] == status:
                    return reply
                await anyio.sleep(0.02)

    async def stream(
        self, task_id: str, *, user: str | None = "alice", **params: Any
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None, httpx.Response]:
        """The events received, the response (None: ended without one), the HTTP response."""
        response = await self.send(
            "tasks/stream", {"taskId": task_id, **params}, task_id, user=user
        )
        if response.headers["content-type"].startswith("application/json"):
            return [], response.json(), response
        messages = [
            json.loads(line[5:])
            for line in response.text.splitlines()
            if line.startswith("data:") and line[5:].strip()
        ]
        events = [m["params"] for m in messages if m.get("method") == "notifications/tasks/event"]
        final = [m for m in messages if "id" in m]
        return events, final[0] if final else None, response


@asynccontextmanager
async def _app(
    kind: str, store: MemoryTaskStore | None = None, **options: Any
) -> AsyncIterator[App]:
    tasks = ReplayTasks(
        {"steps": "optional", "bare": "optional", "report": "optional"},
        owner=_owner,
        lease=1.0,
        check_interval=0.05,
        poll_interval=0.2,
        events=EventRetention(max_events=6),
        store=store,
    )
    gate = Gate()
    buffer = ReplayBuffer.from_url("memory://")
    app = (_sdk_app if kind == "sdk" else _fastmcp_app)(tasks, gate, buffer, **options)
    async with buffer, app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            yield App(client, tasks, gate)


@pytest.fixture(params=["sdk", "fastmcp"])
async def app(request: pytest.FixtureRequest) -> AsyncIterator[App]:
    async with _app(request.param) as made:
        yield made


def _empty(final: dict[str, Any] | None) -> bool:
    """An empty result as the 2026-07-28 SDK sends one (its envelope fields only)."""
    if final is None or "result" not in final:
        return False
    result = dict(final["result"])
    result.pop("_meta", None)
    return result in ({}, {"resultType": "complete"})


def _seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["seq"] for e in events]


async def test_a_finished_task_streams_exactly_from_any_cursor_then_ends(app: App) -> None:
    task_id = await app.task("steps", n=3)
    await app.until(task_id, "completed")
    events, final, _ = await app.stream(task_id)
    assert _seqs(events) == [0, 1, 2, 3, 4] and _empty(final)
    status, step = "dev.replaystore/status", "com.example/step"
    assert [e["type"] for e in events] == [status, step, step, step, status]
    assert [e["payload"] for e in events[1:4]] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert events[-1]["payload"] == {"status": "completed"}
    for event in events:
        assert event["taskId"] == task_id
        assert event["_meta"] == {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
    events, final, _ = await app.stream(task_id, after=2)
    assert _seqs(events) == [3, 4] and _empty(final)
    events, final, response = await app.stream(task_id, after=4)  # nothing left: ends at once
    assert events == [] and _empty(final)
    assert response.headers["content-type"].startswith("application/json")


async def test_bad_cursors_and_unseen_tasks_are_refused(app: App) -> None:
    task_id = await app.task("steps", n=1)
    await app.until(task_id, "completed")  # seq 0..2
    for after in (-1, 1.5, "1", True, None, 3, 10**30):
        events, final, _ = await app.stream(task_id, after=after)
        assert events == [] and final is not None and final["error"]["code"] == -32602, after
    unknown = (await app.get("B" * 24))["error"]
    for user in ("mallory", None):
        _, final, _ = await app.stream(task_id, user=user)
        assert final is not None and final["error"] == unknown
    _, final, _ = await app.stream("B" * 24)
    assert final is not None and final["error"] == unknown


async def test_a_cursor_below_the_retained_range_is_events_gone(app: App) -> None:
    task_id = await app.task("steps", n=8)  # seq 0..9, six retained: 4..9
    await app.until(task_id, "completed")
    for after in (0, 2):
        events, final, _ = await app.stream(task_id, after=after)
        assert events == [] and final is not None
        assert final["error"]["code"] == -32010
        assert final["error"]["data"] == {
            "reason": "events_gone",
            "taskId": task_id,
            "earliestSeq": 4,
        }
    events, final, _ = await app.stream(task_id, after=3)
    assert _seqs(events) == [4, 5, 6, 7, 8, 9] and _empty(final)
    events, _, _ = await app.stream(task_id)
    assert _seqs(events) == [4, 5, 6, 7, 8, 9]


async def test_event_streams_are_advertised_and_bare_types_refused(app: App) -> None:
    discover = (await app.send("server/discover", {}, "server/discover")).json()
    assert discover["result"]["capabilities"]["extensions"][EXTENSION] == {"eventStreams": {}}
    task_id = await app.task("bare")
    done = await app.until(task_id, "completed")
    assert "no vendor prefix" in done["result"]["result"]["content"][0]["text"]


async def test_progress_a_task_reports_is_a_task_event() -> None:
    async with _app("sdk") as app:
        task_id = await app.task("report")
        await app.until(task_id, "completed")
        events, final, _ = await app.stream(task_id, after=0)
        assert [(e["type"], e["payload"]) for e in events[:2]] == [
            ("dev.replaystore/progress", {"progress": 1, "total": 2, "message": "half"}),
            ("dev.replaystore/progress", {"progress": 2}),
        ]
        assert _seqs(events) == [1, 2, 3] and _empty(final)


async def test_live_events_follow_the_replay_and_a_drain_ends_without_a_result() -> None:
    async with _app("sdk") as app:
        task_id = await app.task("steps", n=2, hold=True)
        streamed: list[Any] = []

        async def follow(task_id: str) -> None:
            streamed.append(await app.stream(task_id))

        async with anyio.create_task_group() as group:
            group.start_soon(follow, task_id)
            await anyio.sleep(0.3)
            app.gate.open.set()  # a live event, then the end
        [(events, final, _)] = streamed
        assert _seqs(events) == [0, 1, 2, 3, 4] and _empty(final)

        app.gate.open = anyio.Event()
        held = await app.task("steps", n=1, hold=True)
        streamed.clear()
        async with anyio.create_task_group() as group:
            group.start_soon(follow, held)
            await anyio.sleep(0.3)
            app.tasks.drain()
        [(events, final, response)] = streamed
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        assert _seqs(events) == [0, 1] and final is None  # cut, never `{}`
        assert (await app.get(held))["result"]["status"] == "working"  # the task goes on
        app.gate.open.set()


async def test_an_append_whose_reply_was_lost_is_sent_again_and_stored_once() -> None:
    async with _app("sdk", store=_LostReplies()) as app:
        task_id = await app.task("steps", n=2)
        await app.until(task_id, "completed")
        events, final, _ = await app.stream(task_id)
        assert [e["payload"] for e in events] == [
            {"status": "working"},
            {"n": 0},
            {"n": 1},
            {"status": "completed"},
        ]
        assert _seqs(events) == [0, 1, 2, 3] and _empty(final)


async def test_a_store_outage_is_503_never_an_empty_result() -> None:
    async with _app("sdk", store=_Outage()) as app:
        task_id = await app.task("steps", n=1)
        events, final, response = await app.stream(task_id)
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert events == [] and final is not None and "result" not in final


async def test_an_app_answering_json_only_neither_serves_nor_advertises_streams() -> None:
    # Its notifications would be dropped: a stream would look complete with no event.
    async with _app("sdk", json_response=True) as app:
        discover = (await app.send("server/discover", {}, "server/discover")).json()
        assert "eventStreams" not in discover["result"]["capabilities"]["extensions"][EXTENSION]
        task_id = await app.task("steps", n=1)
        await app.until(task_id, "completed")
        events, final, _ = await app.stream(task_id)
        assert events == [] and final is not None and final["error"]["code"] == -32601

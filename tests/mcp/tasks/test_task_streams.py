"""``tasks/stream`` on a replica that does not run the task: two real processes on one Redis.

The task runs on replica ``a``; its events are streamed from replica ``b``,
which reads them from the store and is woken by the store's announcements.
Checked: live events arrive on ``b`` while the task runs (the seam between
what ``b`` read and what comes later holds no gap and no duplicate), a
stream resumed from a cursor again and again gets each ``seq`` once, in
order, and the end; bad cursors and unknown tasks are refused on ``b`` as on
the runner. Retention (``events_gone``) is checked in one process
(``test_task_streams_inprocess.py``).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest

from replaystore.testing.servers import ServerHandle
from tests.mcp._support import ServerProcess, spawn_replica, wait_ready

pytestmark = pytest.mark.anyio

EXTENSION = "io.modelcontextprotocol/tasks"
STATUS = "dev.replaystore/status"
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def pair(mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    logs = tmp_path_factory.mktemp("task-streams")
    store = f"{mcp_redis.url}?prefix=ts:"
    started = [spawn_replica(f"stream-{name}", store, logs) for name in "ab"]
    try:
        wait_ready(started)
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as client:
        yield client


def _request(method: str, params: dict[str, Any], name: str) -> tuple[dict[str, Any], Any]:
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
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method,
            "params": {**params, "_meta": meta}}  # fmt: skip
    return body, headers


async def _send(
    http: httpx.AsyncClient, server: ServerProcess, method: str, params: dict[str, Any], name: str
) -> dict[str, Any]:
    body, headers = _request(method, params, name)
    reply: dict[str, Any] = (await http.post(server.url, json=body, headers=headers)).json()
    return reply


async def _stream(
    http: httpx.AsyncClient, server: ServerProcess, task_id: str, *, most: int = 1000, **params: Any
) -> tuple[list[tuple[float, dict[str, Any]]], dict[str, Any] | None]:
    """Up to ``most`` events (with when each arrived), then the response if it came."""
    body, headers = _request("tasks/stream", {"taskId": task_id, **params}, task_id)
    events: list[tuple[float, dict[str, Any]]] = []
    async with http.stream("POST", server.url, json=body, headers=headers) as response:
        if response.headers["content-type"].startswith("application/json"):
            return [], json.loads(await response.aread())
        async for line in response.aiter_lines():
            if not line.startswith("data:") or not line[5:].strip():
                continue
            message = json.loads(line[5:])
            if "id" in message:
                return events, message
            events.append((time.monotonic(), message["params"]))
            if len(events) == most:
                return events, None  # the client leaves: delivery stops, the task goes on
    return events, None


async def _task(http: httpx.AsyncClient, runner: ServerProcess, n: int, interval_ms: int) -> str:
    arguments = {"n": n, "interval_ms": interval_ms}
    reply = await _send(http, runner, "tools/call", {"name": "countdown", "arguments": arguments},
                        "countdown")  # fmt: skip
    task_id: str = reply["result"]["taskId"]
    return task_id


def _empty(final: dict[str, Any] | None) -> bool:
    if final is None or "result" not in final:
        return False
    result = {k: v for k, v in final["result"].items() if k != "_meta"}
    return result in ({}, {"resultType": "complete"})


async def test_a_stream_on_the_replica_not_running_the_task_is_live_and_exact(
    pair: list[ServerProcess], http: httpx.AsyncClient
) -> None:
    runner, reader = pair
    steps = 6
    task_id = await _task(http, runner, steps, 150)
    with anyio.fail_after(20):  # a hang guard
        events, final = await _stream(http, reader, task_id)
    seqs = [event["seq"] for _, event in events]
    assert seqs == list(range(steps + 2)) and _empty(final)
    assert events[0][1]["type"] == STATUS and events[0][1]["payload"] == {"status": "working"}
    assert events[-1][1]["type"] == STATUS and events[-1][1]["payload"]["status"] == "completed"
    # Delivered as the runner emitted them, not all at the end: live across replicas.
    assert events[-2][0] - events[1][0] > 0.3
    done = await _send(http, reader, "tasks/get", {"taskId": task_id}, task_id)
    assert done["result"]["status"] == "completed"


async def test_resuming_from_a_cursor_on_either_replica_gets_each_seq_once(
    pair: list[ServerProcess], http: httpx.AsyncClient
) -> None:
    steps = 8
    task_id = await _task(http, pair[0], steps, 60)
    got: list[int] = []
    final: dict[str, Any] | None = None
    with anyio.fail_after(30):  # a hang guard
        for server in itertools.cycle([pair[1], pair[0]]):
            cursor = {"after": got[-1]} if got else {}
            events, final = await _stream(http, server, task_id, most=2, **cursor)
            got += [event["seq"] for _, event in events]
            if final is not None:
                break
    assert got == list(range(steps + 2)) and _empty(final)


async def test_bad_cursors_and_unknown_tasks_are_refused_on_the_other_replica(
    pair: list[ServerProcess], http: httpx.AsyncClient
) -> None:
    runner, reader = pair
    task_id = await _task(http, runner, 1, 0)
    with anyio.fail_after(20):
        _, final = await _stream(http, reader, task_id)  # until it ended: seq 0..2
    assert _empty(final)
    for after in (-1, 2.5, "1", None, 3):
        events, final = await _stream(http, reader, task_id, after=after)
        assert events == [] and final is not None and final["error"]["code"] == -32602, after
    unknown = await _send(http, reader, "tasks/get", {"taskId": "C" * 24}, "C" * 24)
    _, final = await _stream(http, reader, "C" * 24)
    assert final is not None and final["error"] == unknown["error"]


def test_no_replica_logged_a_traceback(pair: list[ServerProcess]) -> None:
    for server in pair:
        assert "Traceback" not in server.log_tail(200), server.log_tail()

"""What ``TaskEventStream`` does with each answer a ``tasks/stream`` may get, one answer at a time.

The server here is a scripted ASGI app in the test's process: it answers
each request with the next scripted response and records the cursor the
client sent. Only a scripted server can break the rules on purpose (skip a
``seq``, send another task's event), which is what the client must catch;
the real servers, replicas, proxies and faults are in
``test_task_event_streams.py``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import httpx2
import pytest

from replaystore.mcp.client import (
    EventsGoneError,
    TaskClient,
    TaskRequestError,
    TaskStreamError,
    TaskUnavailableError,
)

pytestmark = pytest.mark.anyio

TASK = "t-1"
Scope = MutableMapping[str, Any]


def event(seq: int, task_id: str = TASK) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/tasks/event",
        "params": {"seq": seq, "taskId": task_id, "type": "com.example/step",
                   "payload": {"n": seq}, "_meta": {}},
    }  # fmt: skip


class Script:
    """An ASGI app answering request i with ``answers[i]`` (events, then an end)."""

    def __init__(self, *answers: tuple[int, list[dict[str, Any]], Any, dict[str, str]]) -> None:
        self.answers = list(answers)
        self.cursors: list[object] = []

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Scope]],
        send: Callable[[Scope], Awaitable[None]],
    ) -> None:
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(raw)
        assert request["method"] == "tasks/stream"
        self.cursors.append(request["params"].get("after", "omitted"))
        status, events, end, headers = self.answers.pop(0)
        frames = list(events)
        if end == "result":
            frames.append({"jsonrpc": "2.0", "id": request["id"], "result": {}})
        elif isinstance(end, dict):
            frames.append({"jsonrpc": "2.0", "id": request["id"], "error": end})
        if status == 200 and events:
            kind = b"text/event-stream"
            body = b"".join(
                b"event: message\ndata: " + json.dumps(f).encode() + b"\n\n" for f in frames
            )
        else:
            kind, body = b"application/json", json.dumps(frames[-1] if frames else {}).encode()
        head = [(b"content-type", kind), *((k.encode(), v.encode()) for k, v in headers.items())]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})


def client(script: Script, retry_for: float = 2.0) -> TaskClient:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=script))
    return TaskClient(
        "http://fake/mcp", http=http, backoff=0.01, max_backoff=0.05, retry_for=retry_for
    )


async def collect(script: Script, retry_for: float = 2.0, **options: Any) -> tuple[list[int], Any]:
    async with client(script, retry_for) as tasks:
        stream = tasks.stream_events(TASK, **options)
        seqs = [ev.seq async for ev in stream]
        return seqs, stream


async def test_a_stream_ending_without_a_result_is_reopened_after_the_last_seq() -> None:
    script = Script(
        (200, [event(0), event(1), event(2)], None, {}),  # cut: no result
        (200, [event(2), event(3)], None, {}),  # a replica that sends 2 again
        (200, [event(4)], "result", {}),
    )
    seqs, stream = await collect(script)
    assert seqs == [0, 1, 2, 3, 4]
    assert script.cursors == ["omitted", 2, 3]
    assert stream.duplicates == 1 and stream.completed and stream.last_seq == 4


async def test_a_skipped_seq_raises_and_is_never_passed_over() -> None:
    script = Script((200, [event(5), event(6), event(8)], "result", {}))
    got: list[int] = []

    async def read() -> None:
        async with client(script) as tasks:
            async for ev in tasks.stream_events(TASK, after=4):
                got.append(ev.seq)

    with pytest.raises(TaskStreamError, match=r"event 8 after 6; events 7\.\.7"):
        await read()
    assert got == [5, 6]


async def test_a_first_event_past_the_cursor_is_a_gap_too() -> None:
    script = Script((200, [event(3)], "result", {}))
    with pytest.raises(TaskStreamError, match="after 0"):
        await collect(script, after=0)


async def test_another_tasks_event_on_the_stream_raises() -> None:
    script = Script((200, [event(0, task_id="t-2")], "result", {}))
    with pytest.raises(TaskStreamError, match="t-2"):
        await collect(script)


GONE: dict[str, Any] = {"code": -32010, "message": "Task events are no longer available",
        "data": {"reason": "events_gone", "taskId": TASK, "earliestSeq": 7}}  # fmt: skip


async def test_events_gone_raises_with_the_earliest_seq_kept() -> None:
    with pytest.raises(EventsGoneError) as caught:
        await collect(Script((200, [], GONE, {})), after=2)
    assert caught.value.earliest_seq == 7 and caught.value.after == 2
    assert caught.value.task_id == TASK and caught.value.code == -32010


async def test_events_gone_can_go_on_from_the_earliest_kept_and_says_what_was_lost() -> None:
    script = Script(
        (200, [event(3)], GONE, {}),  # a slow reader: gone after one event
        (200, [event(7), event(8)], "result", {}),
    )
    seqs, stream = await collect(script, after=2, on_gone="earliest")
    assert seqs == [3, 7, 8]
    assert script.cursors == [2, 6]
    assert stream.lost == [(4, 6)]


async def test_events_gone_that_contradicts_the_cursor_is_a_broken_stream() -> None:
    gone = {**GONE, "data": {**GONE["data"], "earliestSeq": 3}}
    with pytest.raises(TaskStreamError, match="events_gone from 3"):
        await collect(Script((200, [], gone, {})), after=2, on_gone="earliest")


async def test_a_503_is_retried_after_its_retry_after() -> None:
    unavailable = {"code": -32603, "message": "the task store is unreachable",
                   "data": {"reason": "storage_error"}}  # fmt: skip
    script = Script(
        (503, [], unavailable, {"Retry-After": "0.3"}),
        (502, [], None, {}),  # a balancer's own page: no JSON-RPC answer
        (200, [event(0)], "result", {}),
    )
    started = anyio.current_time()
    seqs, stream = await collect(script)
    assert seqs == [0] and stream.requests == 3
    assert anyio.current_time() - started >= 0.05  # Retry-After, capped at max_backoff


async def test_a_bad_cursor_is_a_request_error_not_retried() -> None:
    bad = {"code": -32602, "message": "after is beyond the last issued seq"}
    with pytest.raises(TaskRequestError) as caught:
        await collect(Script((200, [], bad, {})), after=99)
    assert caught.value.code == -32602 and not isinstance(caught.value, TaskUnavailableError)


async def test_failures_without_progress_end_after_retry_for() -> None:
    script = Script(*[(503, [], None, {}) for _ in range(200)])
    with pytest.raises(TaskUnavailableError):
        await collect(script, retry_for=0.3)
    assert 3 <= len(script.cursors) < 200


async def test_a_finished_task_with_nothing_left_ends_at_once() -> None:
    seqs, stream = await collect(Script((200, [], "result", {})), after=9)
    assert seqs == [] and stream.completed


def test_a_negative_cursor_is_refused_before_any_request() -> None:
    tasks = TaskClient("http://fake/mcp")
    with pytest.raises(ValueError, match="non-negative"):
        tasks.stream_events(TASK, after=-1)

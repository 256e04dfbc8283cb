"""Bounds on open ``tasks/stream`` requests, on a real ``example-server`` process.

The replica serves at most 5 task event streams at once, at most 3 of one
task per client (``--task-streams 5 --task-client-streams 3``). The streams
are on ``ask`` tasks, which wait for an answer that never comes, so each
stream stays open until the test ends it. Checked:

- a fourth stream of one task is refused with -32602 ``too_many_streams``
  (``limit`` 3) at once, while another task's stream still opens;
- a sixth stream in all is answered ``503`` with ``Retry-After``, which
  :class:`TaskClient` sends again until a slot is free;
- a stream frees its slot however it ends: the client closing its response
  (the 2026-07-28 cancel, a lost connection), the task ending (the stream's
  ``{}``), a refusal or an error (a bad cursor, an unknown task): after
  each, as many streams open again as before.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx
import httpx2
import pytest

from replaystore.mcp.client import TaskClient, TaskEvent, TaskRequestError
from replaystore.mcp.example import parser
from replaystore.mcp.tasks import ReplayTasks
from replaystore.mcp.tasks.stream import DEFAULT_CLIENT_STREAMS, DEFAULT_STREAMS, StreamSlots
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import ServerProcess, spawn_replica, wait_ready
from tests.mcp.tasks._support import Modern

pytestmark = pytest.mark.anyio

PER_CLIENT = 3
PER_REPLICA = 5


@pytest.fixture(scope="module")
def replica(mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    logs = tmp_path_factory.mktemp("task-stream-limits")
    store = f"{mcp_redis.url}?prefix=tsl:"
    limits = ("--task-streams", str(PER_REPLICA), "--task-client-streams", str(PER_CLIENT))
    server = spawn_replica("limits", store, logs, *limits)
    try:
        wait_ready([server])
        yield server
    finally:
        server.stop()


@pytest.fixture
async def streams(replica: ServerProcess) -> AsyncIterator[Streams]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as http, AsyncExitStack() as exits:
        yield Streams(Modern(http, replica.url), exits)


class Stream:
    """One open ``tasks/stream`` response and its lines, read so far up to its first event."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()

    async def message(self) -> dict[str, Any] | None:
        """The next JSON-RPC message on the stream (None: it ended)."""
        async for line in self.lines:
            if line.startswith("data:") and line[5:].strip():
                message: dict[str, Any] = json.loads(line[5:])
                return message
        return None


class Streams:
    """Open ``tasks/stream`` responses, each read up to its first event, kept open."""

    def __init__(self, client: Modern, exits: AsyncExitStack) -> None:
        self.client = client
        self.exits = exits
        self.open: list[Stream] = []
        self.refusal: tuple[int, httpx.Headers, dict[str, Any]] = (0, httpx.Headers(), {})

    async def open_one(self, task_id: str) -> Stream | None:
        """A stream that delivered an event (kept open), or None: refused (``self.refusal``)."""
        body, headers = self.client.envelope("tasks/stream", {"taskId": task_id}, task_id)
        response = await self.exits.enter_async_context(
            self.client.http.stream("POST", self.client.url, json=body, headers=headers)
        )
        if not response.headers["content-type"].startswith("text/event-stream"):
            reply = json.loads(await response.aread())
            self.refusal = (response.status_code, response.headers, reply)
            await response.aclose()
            return None
        stream = Stream(response)
        first = await stream.message()  # the first event: the server serves the stream
        assert first is not None and first["method"] == "notifications/tasks/event", first
        self.open.append(stream)
        return stream

    async def finish(self, task_ids: list[str]) -> None:
        """Cancel the tasks, then read every open stream to its ``{}``: all slots are free then.

        (A stream frees its slot before its result is sent, so the next test
        starts on an idle replica.)
        """
        for task_id in task_ids:
            reply = await self.client.task("tasks/cancel", task_id)
            assert "result" in reply, reply
        while self.open:
            stream = self.open.pop()
            while True:
                message = await stream.message()
                assert message is not None, "a stream of a cancelled task ended without {}"
                if "id" in message:
                    assert "result" in message, message
                    break
            await stream.response.aclose()

    async def close(self, stream: Stream) -> None:
        """The client cancels the stream: it closes the response (and its connection)."""
        self.open.remove(stream)
        await stream.response.aclose()

    async def reopen(self, task_id: str) -> Stream:
        """A stream of ``task_id`` once the server noticed a closed one (it must, and soon)."""
        with anyio.fail_after(10):  # the server learns of a closed connection asynchronously
            while True:
                stream = await self.open_one(task_id)
                if stream is not None:
                    return stream
                await anyio.sleep(0.05)

    async def waiting_task(self) -> str:
        """An ``ask`` task: it waits for an answer, so its streams stay open until ended."""
        created = await self.client.call("ask", {"question": "who?"})
        task_id: str = created["taskId"]
        return task_id

    async def fill(self) -> list[str]:
        """Three tasks; the replica full with streams of the first two (the first at its bound)."""
        tasks = [await self.waiting_task() for _ in range(3)]
        for task_id in [tasks[0]] * PER_CLIENT + [tasks[1]] * (PER_REPLICA - PER_CLIENT):
            assert await self.open_one(task_id) is not None
        return tasks


def _error(refusal: tuple[int, httpx.Headers, dict[str, Any]]) -> dict[str, Any]:
    error: dict[str, Any] = refusal[2]["error"]
    return error


async def test_one_stream_more_than_a_client_may_hold_for_a_task_is_refused(
    streams: Streams,
) -> None:
    first, second = await streams.waiting_task(), await streams.waiting_task()
    with anyio.fail_after(30):  # a hang guard
        for _ in range(PER_CLIENT):
            assert await streams.open_one(first) is not None
        assert await streams.open_one(first) is None
        status, _, reply = streams.refusal
        assert status == 400 and "result" not in reply  # the SDK's status for -32602
        error = _error(streams.refusal)
        assert error["code"] == -32602
        assert error["data"] == {"reason": "too_many_streams", "taskId": first, "limit": PER_CLIENT}
        assert "at most 3 per client" in error["message"]
        assert await streams.open_one(second) is not None  # the bound is per task
        # Closing one frees its slot: one more opens, and no more than that.
        await streams.close(streams.open[0])
        await streams.reopen(first)
        assert await streams.open_one(first) is None
        assert _error(streams.refusal)["data"]["reason"] == "too_many_streams"
        await streams.finish([first, second])


async def test_one_stream_more_than_the_replica_serves_is_503_with_retry_after(
    streams: Streams,
) -> None:
    with anyio.fail_after(30):  # a hang guard
        tasks = await streams.fill()
        assert len(streams.open) == PER_REPLICA
        assert await streams.open_one(tasks[2]) is None
        status, headers, _ = streams.refusal
        assert status == 503 and headers["retry-after"] == "1"
        error = _error(streams.refusal)
        assert error["code"] == -32603
        assert error["data"] == {"reason": "replica_busy", "limit": PER_REPLICA}
        # A client at its own bound gets its own refusal, not the replica's 503.
        assert await streams.open_one(tasks[0]) is None
        assert _error(streams.refusal)["code"] == -32602
        await streams.close(streams.open[-1])
        await streams.reopen(tasks[2])
        assert await streams.open_one(tasks[2]) is None
        assert streams.refusal[0] == 503
        await streams.finish(tasks)


async def test_streams_of_a_task_that_ends_give_back_their_slots(streams: Streams) -> None:
    ending, other = await streams.waiting_task(), await streams.waiting_task()
    more = [await streams.waiting_task() for _ in range(PER_REPLICA - PER_CLIENT)]
    with anyio.fail_after(30):  # a hang guard
        for _ in range(PER_CLIENT):
            assert await streams.open_one(ending) is not None
        await streams.finish([ending])  # each ends with its result: the task is terminal
        # Every slot is free again (freed before the result was sent: no waiting).
        for task_id in [other] * PER_CLIENT + more:
            assert await streams.open_one(task_id) is not None
        assert await streams.open_one(other) is None
        await streams.finish([other, *more])


async def test_refused_and_failed_streams_take_no_slot(streams: Streams) -> None:
    task_id = await streams.waiting_task()
    with anyio.fail_after(30):  # a hang guard
        for _ in range(10):  # bad cursors, unknown tasks, refusals: none holds a slot
            for after in (-1, 99):  # refused before and after the store was read
                reply = await streams.client.task("tasks/stream", task_id, after=after)
                assert reply["error"]["code"] == -32602
            assert await streams.open_one("C" * 24) is None
        for _ in range(PER_CLIENT):
            assert await streams.open_one(task_id) is not None
        for _ in range(10):
            assert await streams.open_one(task_id) is None
        while streams.open:
            await streams.close(streams.open[0])
        for _ in range(PER_CLIENT):
            await streams.reopen(task_id)
        await streams.finish([task_id])


async def _first(client: TaskClient, task_id: str) -> TaskEvent:
    """The first event :meth:`TaskClient.stream_events` hands over (the stream closed then)."""
    async with client.stream_events(task_id) as events:
        async for event in events:
            return event
    raise AssertionError("the stream ended without an event")


async def test_the_task_client_waits_out_a_busy_replica_but_not_its_own_bound(
    streams: Streams,
) -> None:
    """``TaskClient.stream_events``: the 503 is sent again until a slot frees, the -32602 raised."""
    with anyio.fail_after(30):  # a hang guard
        tasks = await streams.fill()
        async with httpx2.AsyncClient(timeout=15.0) as http2:
            client = TaskClient(streams.client.url, http=http2, backoff=0.05, max_backoff=0.2)
            with pytest.raises(TaskRequestError) as refused:
                await _first(client, tasks[0])
            assert refused.value.code == -32602
            assert refused.value.error["data"]["reason"] == "too_many_streams"
            got: list[TaskEvent] = []

            async def first_event() -> None:
                got.append(await _first(client, tasks[2]))

            async with anyio.create_task_group() as group:
                group.start_soon(first_event)
                await anyio.sleep(1.0)  # the client is answered 503 and asks again meanwhile
                assert got == []
                await streams.close(streams.open[-1])
            assert got[0].seq == 0 and got[0].task_id == tasks[2]
        await streams.finish(tasks)


def test_the_bounds_have_defaults_and_refuse_nonsense() -> None:
    assert (DEFAULT_CLIENT_STREAMS, DEFAULT_STREAMS) == (16, 1000)
    tasks = ReplayTasks({})
    assert (tasks.streams.per_client, tasks.streams.total) == (16, 1000)
    options = parser().parse_args([])
    assert (options.task_client_streams, options.task_streams) == (16, 1000)
    for bad in ({"max_streams": 0}, {"max_client_streams": -1}):
        with pytest.raises(ValueError, match="at least 1"):
            ReplayTasks({}, **bad)
    with pytest.raises(TypeError):
        StreamSlots(True, 10)
    for flag in ("--task-streams", "--task-client-streams"):
        with pytest.raises(SystemExit):
            parser().parse_args([flag, "0"])


def test_no_traceback_was_logged(replica: ServerProcess) -> None:
    assert "Traceback" not in replica.log_tail(400), replica.log_tail()

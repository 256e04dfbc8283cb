"""The task events contract, run against memory, fakeredis, a real Redis and a Cluster.

A task's events get ``seq`` 0, 1, 2… from the store; status changes are
events appended in the step that makes them; an append is fenced by the
runner's hold on the task; retention drops the oldest events only, so the
facts of one read (floor, next) are all a cursor is judged on.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import pytest
from fakeredis import FakeAsyncRedis, FakeServer

from replaystore import ReplayBuffer
from replaystore.backends.coordination import coordination_of
from replaystore.taskstore import LOST_ERROR, EventRetention, TaskStore, new_task_id
from replaystore.taskstore.events import event_blob
from replaystore.taskstore.sep2694 import STATUS_TYPE
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.anyio

MakeStore = Callable[[], Awaitable[TaskStore]]
KEEP = EventRetention()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "fakeredis", "redis", "cluster"])
async def make_store(
    request: pytest.FixtureRequest, real_servers: RealServers
) -> AsyncIterator[MakeStore]:
    """``await make_store()``: a store; stores made in one test are replicas of one another."""
    kind = request.param
    prefix = f"e{uuid.uuid4().hex[:10]}:"
    fake = FakeServer()
    buffers: list[ReplayBuffer] = []

    async def factory() -> TaskStore:
        if kind == "memory":
            buffer = ReplayBuffer.from_url(f"memory://{prefix}")
        elif kind == "fakeredis":
            client = FakeAsyncRedis(server=fake)
            buffer = ReplayBuffer.from_url("redis://", prefix=prefix, client=client)
        else:
            buffer = ReplayBuffer.from_url(real_servers.shared(kind).url, prefix=prefix)
        await buffer.__aenter__()
        buffers.append(buffer)
        return coordination_of(buffer.backend).task_store()

    yield factory
    for buffer in buffers:
        await buffer.aclose()


def _step(n: int) -> bytes:
    return event_blob("com.example/step", {"n": n}, KEEP)


async def test_seq_is_dense_from_zero_and_read_alike_on_another_replica(
    make_store: MakeStore,
) -> None:
    a, b = await make_store(), await make_store()
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
    assert [await a.emit(task_id, "r1", _step(n)) for n in range(3)] == [1, 2, 3]
    page = await b.events(task_id)
    assert page is not None and (page.floor, page.next_seq, page.status) == (0, 4, "working")
    assert [e.seq for e in page.events] == [0, 1, 2, 3]
    assert (page.events[0].type, page.events[0].payload) == (STATUS_TYPE, {"status": "working"})
    assert [e.payload for e in page.events[1:]] == [{"n": 0}, {"n": 1}, {"n": 2}]
    part = await b.events(task_id, start=2, limit=1)
    assert part is not None and [(e.seq, e.payload) for e in part.events] == [(2, {"n": 1})]
    assert await b.events(new_task_id()) is None


async def test_status_changes_are_events_consistent_with_get(make_store: MakeStore) -> None:
    a, b = await make_store(), await make_store()
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
    [key] = await a.ask(task_id, "r1", [{"method": "elicitation/create"}]) or []
    assert await b.respond(task_id, {key: {"action": "accept"}})
    await a.emit(task_id, "r1", _step(0))
    assert await b.cancel(task_id, message="stop")
    assert await a.emit(task_id, "r1", _step(1)) is None  # ended: nothing more is stored
    page = await b.events(task_id)
    record = await b.get(task_id)
    assert page is not None and record is not None and page.terminal
    statuses = [e.payload for e in page.events if e.type == STATUS_TYPE]
    assert statuses == [
        {"status": "working"},
        {"status": "input_required"},
        {"status": "working"},
        {"status": "cancelled", "statusMessage": "stop"},
    ]
    assert page.events[-1].payload["status"] == record.status
    assert page.next_seq == page.events[-1].seq + 1 == 5


async def test_an_append_is_fenced_by_the_runners_hold(make_store: MakeStore) -> None:
    a, b = await make_store(), await make_store()
    task_id = new_task_id()
    call = {"name": "tool", "arguments": {}}
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000, attempts=2, call=call)
    assert await a.emit(task_id, "r2", _step(0)) is None  # not the runner
    assert await a.emit(task_id, "r1", _step(1)) == 1
    assert await a.beat(task_id, "r1", 0) is not None  # handed over
    assert await b.claim(task_id, "r2", 5) == call
    assert await a.emit(task_id, "r1", _step(2)) is None  # taken over: the old run adds nothing
    assert await b.emit(task_id, "r2", _step(3)) == 3  # the new run continues the sequence
    page = await a.events(task_id)
    assert page is not None
    assert [(e.seq, e.payload) for e in page.events] == [
        (0, {"status": "working"}),
        (1, {"n": 1}),
        (2, {"status": "working", "attempt": 2}),
        (3, {"n": 3}),
    ]


async def test_a_task_failed_as_lost_says_so_last(make_store: MakeStore) -> None:
    a = await make_store()
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=0.05, ttl_ms=60_000)
    for _ in range(2):  # a lapse is judged a lease after it was first seen
        await anyio.sleep(0.1)
        await a.get(task_id)
    page = await a.events(task_id)
    record = await a.get(task_id)
    assert page is not None and record is not None and page.status == record.status == "failed"
    assert record.error is not None and record.error["code"] == LOST_ERROR["code"]
    assert page.events[-1].payload == {"status": "failed", "statusMessage": record.message}


async def test_retention_drops_the_oldest_only(make_store: MakeStore) -> None:
    a = await make_store()
    task_id = new_task_id()
    kept = EventRetention(max_events=3, after_terminal=0)
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000, events=kept)
    for n in range(5):
        await a.emit(task_id, "r1", _step(n))
    page = await a.events(task_id, start=1)
    assert page is not None and (page.floor, page.next_seq) == (3, 6)
    assert [e.seq for e in page.events] == [3, 4, 5]  # from the floor: the judge decides
    assert await a.finish(task_id, "completed", result={}, runner="r1")
    ended = await a.events(task_id)
    assert ended is not None and (ended.floor, ended.next_seq, ended.events) == (7, 7, [])

    aged = new_task_id()
    await a.create(aged, runner="r1", lease=5, ttl_ms=60_000, events=EventRetention(max_age=0.05))
    await anyio.sleep(0.1)
    await a.emit(aged, "r1", _step(0))
    page = await a.events(aged)
    assert page is not None and (page.floor, [e.seq for e in page.events]) == (1, [1])


async def test_events_are_the_owners_only(make_store: MakeStore) -> None:
    a = await make_store()
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000, owner="alice")
    assert await a.events(task_id, owner="bob") is None
    assert await a.events(task_id) is None
    assert await a.events(task_id, owner="alice") is not None


async def test_an_append_wakes_a_reader_on_another_replica(make_store: MakeStore) -> None:
    a, b = await make_store(), await make_store()
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
    woken = anyio.Event()
    async with b.event_wakeups(task_id, woken.set):
        await a.emit(task_id, "r1", _step(0))
        with anyio.fail_after(3):
            await woken.wait()


async def test_an_append_sent_again_under_its_key_is_stored_once(make_store: MakeStore) -> None:
    a, b = await make_store(), await make_store()
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
    assert await a.emit(task_id, "r1", _step(0), key="1") == 1
    assert await b.emit(task_id, "r1", _step(0), key="1") == 1  # the reply was lost: sent again
    assert await a.emit(task_id, "r1", _step(1), key="2") == 2
    assert await a.emit(task_id, "r1", _step(2)) == 3  # no key: always a new event
    page = await b.events(task_id)
    assert page is not None and [e.seq for e in page.events] == [0, 1, 2, 3]

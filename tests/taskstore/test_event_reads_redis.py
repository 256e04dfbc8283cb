"""Task event reads on a real Redis: native commands on the hot path, exact under appends.

A read of a live task's events runs no script (``INFO commandstats`` on a
Redis of this module alone); one that has a rule to apply (a lease about to
lapse) still does. A reader racing a runner whose retention drops an event
with every append never gets a page with a gap, a duplicate or a wrong
``seq``. Streams opened one after the other share one subscription for
their wake-ups, which ends a while after the last of them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from replaystore import ReplayBuffer
from replaystore.backends.coordination import coordination_of
from replaystore.backends.redis.coordination import wakeups
from replaystore.taskstore import EventRetention, TaskStore, new_task_id
from replaystore.taskstore.events import event_blob
from replaystore.taskstore.sep2694 import STATUS_TYPE, EventsGone, Start, judge_cursor
from replaystore.testing.servers import ServerHandle
from tests.backends.redis._support import command_calls

pytestmark = pytest.mark.anyio

KEEP = EventRetention(max_events=5)
SCRIPTS = ("evalsha", "eval", "fcall", "evalsha_ro", "eval_ro", "fcall_ro")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def stores(scratch_server: ServerHandle) -> AsyncIterator[tuple[TaskStore, TaskStore, Any]]:
    """Two replicas' task stores on this module's own Redis, and a client for its stats."""
    prefix = f"r{uuid.uuid4().hex[:10]}:"
    buffers = [ReplayBuffer.from_url(scratch_server.url, prefix=prefix) for _ in range(2)]
    for buffer in buffers:
        await buffer.__aenter__()
    a, b = (coordination_of(buffer.backend).task_store() for buffer in buffers)
    backend: Any = buffers[0].backend
    yield a, b, backend.client
    for buffer in buffers:
        await buffer.aclose()


def _step(n: int) -> bytes:
    return event_blob("com.example/step", {"n": n}, KEEP)


async def _scripts_run(client: Any) -> int:
    calls = await command_calls(client)
    return sum(calls.get(name, 0) for name in SCRIPTS)


async def test_a_live_tasks_read_runs_no_script(stores: tuple[TaskStore, TaskStore, Any]) -> None:
    a, b, client = stores
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=60, ttl_ms=60_000)
    for n in range(3):
        await a.emit(task_id, "r1", _step(n))
    await client.config_resetstat()
    whole = await b.events(task_id)
    tail = await b.events(task_id, start=2, limit=1)
    caught_up = await b.events(task_id, start=4)
    assert await _scripts_run(client) == 0
    assert (await command_calls(client)).get("lrange", 0) >= 2
    assert whole is not None and [e.seq for e in whole.events] == [0, 1, 2, 3]
    assert tail is not None and [(e.seq, e.payload) for e in tail.events] == [(2, {"n": 1})]
    assert caught_up is not None and (caught_up.next_seq, caught_up.events) == (4, [])
    beyond = await b.events(task_id, start=2**70)  # judged by the caller: no refusal here
    assert beyond is not None and (beyond.floor, beyond.next_seq, beyond.events) == (0, 4, [])

    # The same count sees the script where a rule may act: a lease about to lapse.
    lapsing = new_task_id()
    await a.create(lapsing, runner="r1", lease=0.5, ttl_ms=60_000)
    await client.config_resetstat()
    page = await b.events(lapsing)
    assert await _scripts_run(client) >= 1  # EVALSHA, and EVAL if the server lacked it
    assert page is not None and [e.type for e in page.events] == [STATUS_TYPE]


async def test_a_read_racing_appends_and_drops_is_exact(
    stores: tuple[TaskStore, TaskStore, Any],
) -> None:
    """Each append drops the oldest event (5 kept), so the floor moves under every read."""
    a, b, _ = stores
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=60, ttl_ms=60_000, events=KEEP)
    appends = 300
    done = anyio.Event()
    delivered: list[int] = []
    pages = gone = 0

    async def runner() -> None:
        for n in range(appends):
            assert await a.emit(task_id, "r1", _step(n)) == n + 1
            if n % 8 == 0:
                await anyio.lowlevel.checkpoint()
        done.set()

    async def reader() -> None:
        nonlocal pages, gone
        last: int | None = None
        while True:
            finished = done.is_set()
            start = None if last is None else last + 1
            page = await b.events(task_id, start=start, limit=3)
            assert page is not None and 0 <= page.floor <= page.next_seq
            pages += 1
            seqs = [e.seq for e in page.events]
            first = page.floor if start is None else max(start, page.floor)
            assert seqs == list(range(first, min(first + 3, page.next_seq)))
            for event in page.events:  # each event under its own seq, none from elsewhere
                want = {"status": "working"} if event.seq == 0 else {"n": event.seq - 1}
                assert event.payload == want
            if last is not None:
                judged = judge_cursor(last, page.floor, page.next_seq)
                if isinstance(judged, EventsGone):
                    gone += 1  # told, never skipped silently: go on from the floor
                else:
                    assert judged == Start(last + 1)
            delivered.extend(seqs)
            if seqs:
                last = seqs[-1]
            if finished and last == appends:
                return
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(runner)
            group.start_soon(reader)
    assert delivered == sorted(set(delivered)) and delivered[-1] == appends
    assert pages > 20 and gone < pages


async def test_readers_one_after_the_other_subscribe_once(
    stores: tuple[TaskStore, TaskStore, Any],
) -> None:
    """A resume is a new stream: it finds the last one's subscription still up, and is woken."""
    a, b, client = stores
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=60, ttl_ms=60_000)
    await client.config_resetstat()
    for n in range(3):
        woken = anyio.Event()
        async with b.event_wakeups(task_id, woken.set):
            await a.emit(task_id, "r1", _step(n))
            with anyio.fail_after(3):
                await woken.wait()
    calls = await command_calls(client)
    assert calls.get("psubscribe", 0) == 1
    assert calls.get("hello", 0) == 0  # no connection opened for any of them after the first


async def test_the_subscription_ends_a_while_after_its_last_reader(
    stores: tuple[TaskStore, TaskStore, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wakeups, "LINGER", 0.2)
    a, b, client = stores
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=60, ttl_ms=60_000)
    before = await client.pubsub_numpat()
    async with b.event_wakeups(task_id, lambda: None):
        assert await client.pubsub_numpat() == before + 1
    for _ in range(100):  # up to 5 s
        if await client.pubsub_numpat() <= before:
            break
        await anyio.sleep(0.05)
    assert await client.pubsub_numpat() <= before
    woken = anyio.Event()  # a reader after the end subscribes again
    async with b.event_wakeups(task_id, woken.set):
        await a.emit(task_id, "r1", _step(0))
        with anyio.fail_after(3):
            await woken.wait()

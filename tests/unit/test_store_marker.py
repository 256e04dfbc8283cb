"""The store's run marker: a step back of the store is seen by every process, declared once.

On fakeredis (the marker is a few Lua lines on one key); the restore itself,
with real processes and a real Redis restarted from an older snapshot, is in
``tests/mcp/test_restores.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
import pytest
from fakeredis import FakeAsyncRedis, FakeServer

from replaystore import ReplayBuffer, Retention, Verdict
from replaystore.backends.redis import RedisBackend, keys
from replaystore.backends.redis.marker import StoreMarker
from replaystore.taskstore import RESTORED_ERROR

pytestmark = pytest.mark.anyio

KEY = "rs{store}:era"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _process(client: FakeAsyncRedis, regressions: list[str]) -> StoreMarker:
    marker = StoreMarker(lambda command: client.execute_command(*command), "rs")

    async def react() -> None:
        regressions.append(marker.era or "")

    marker.on_regressed(react)
    return marker


async def test_a_count_gone_back_is_declared_once_and_every_process_learns_it() -> None:
    client = FakeAsyncRedis(server=FakeServer())
    seen_a: list[str] = []
    seen_b: list[str] = []
    a, b = _process(client, seen_a), _process(client, seen_b)
    await a.look()
    old = await b.known()
    assert a.era == old and a.since == 0
    record_era = old
    for _ in range(3):
        await a.counted()  # sessions ended, tasks finished
    await b.look()  # b served none of them, and knows them
    assert (a.count, b.count) == (3, 3)

    await client.hset(KEY, "n", 1)  # the store restored to a snapshot taken after one of them
    await b.look()
    assert b.era != old and b.since > 0 and seen_b == [b.era]
    assert not b.trusts(record_era) and b.trusts(b.era) and b.trusts(None)
    await a.look()  # a learns the era b declared: one era between them
    assert a.era == b.era and seen_a == [b.era]
    await a.look()
    assert seen_a == [b.era]  # learnt once


async def test_a_reply_overtaken_by_a_count_declares_nothing() -> None:
    client = FakeAsyncRedis(server=FakeServer())
    seen: list[str] = []
    a = _process(client, seen)
    await a.look()
    old_reply = await client.execute_command(*a.read)
    await a.counted()
    await a.seen(old_reply)  # read before the count, taken in after it
    assert seen == [] and a.count == 1


async def test_a_marker_gone_is_a_step_back_and_an_older_era_too() -> None:
    client = FakeAsyncRedis(server=FakeServer())
    seen: list[str] = []
    a = _process(client, seen)
    first = await a.known()
    await client.delete(KEY)  # restored to before the marker existed
    await a.look()
    second = a.era
    assert second not in (None, first) and seen == [second]
    await client.hset(KEY, mapping={"id": first, "at": 0})  # restored to the first era
    await a.look()
    assert a.era not in (first, second) and len(seen) == 2


async def test_a_process_that_never_saw_the_newer_facts_cannot_tell() -> None:
    """The bound the docs state: a process started after the restore trusts what it finds."""
    client = FakeAsyncRedis(server=FakeServer())
    a = _process(client, [])
    era = await a.known()
    await a.counted()
    await client.hset(KEY, "n", 0)
    late: list[str] = []
    c = _process(client, late)
    await c.look()
    assert c.era == era and late == []


async def _restore(client: FakeAsyncRedis, key: str, fields: dict[bytes, bytes]) -> None:
    """``key`` as it was when ``fields`` were read, and the count of ended things back to 0."""
    await client.delete(key)
    await client.hset(key, mapping=fields)  # type: ignore[arg-type]
    await client.hset(KEY, "n", 0)


async def test_records_from_before_a_step_back_are_refused_and_tasks_never_run_again() -> None:
    client = FakeAsyncRedis(server=FakeServer())
    backend = RedisBackend(Retention(), client, prefix="rs")
    on_redis = backend.coordination()
    registry, tasks = on_redis.registry(), on_redis.task_store()
    buffer = ReplayBuffer(backend)
    await buffer.open_session("s")
    await registry.put_session("s", {"version": "v"}, 60)
    record_key = keys.registry(backend.key_base("s"))
    snapshot = await client.hgetall(record_key)
    assert await registry.end_session("s") is None  # ended, and counted
    await _restore(client, record_key, snapshot)
    await registry.look_back()
    assert await registry.hold("s", "r2") is None
    assert await registry.get_session("s") is None
    gone = await buffer.resolve("s", "0")  # why, for every request
    assert gone.verdict is Verdict.UNKNOWN_SESSION
    tombstone = gone.evidence.tombstone
    assert tombstone is not None and tombstone.verdict is Verdict.STORE_REGRESSED, gone

    call = {"name": "countdown", "arguments": {}}
    await tasks.create("t", runner="r1", lease=0.01, ttl_ms=60_000, attempts=2, call=call)
    task_key = tasks.keys("t")[0]  # type: ignore[attr-defined]
    snapshot = await client.hgetall(task_key)
    assert await tasks.finish("t", "completed", result={"content": []}, runner="r1")
    await _restore(client, task_key, snapshot)
    await registry.look_back()
    await anyio.sleep(0.05)  # the restored lease lapses: a claim would run it again
    assert await tasks.claim("t", "r2", 1.0) is None
    ended = await tasks.get("t")
    assert ended is not None and ended.status == "failed", ended
    assert ended.error == RESTORED_ERROR
    assert await client.hget(task_key, "att") == b"1"  # run once


async def test_a_session_ended_is_counted_in_the_same_step_and_ends_even_if_the_count_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On one server the record's end and its count are one script: one round trip."""
    disabled = logging.root.manager.disable  # an in-process bench may have turned warnings off
    logging.disable(logging.NOTSET)
    try:
        await _counted_in_the_same_step(caplog)
    finally:
        logging.disable(disabled)


async def _counted_in_the_same_step(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="replaystore.backends.redis.coordination.registry")
    client = FakeAsyncRedis(server=FakeServer())
    backend = RedisBackend(Retention(), client, prefix="rs")
    registry = backend.coordination().registry()
    await registry.put_session("s", {"version": "v"}, 60)
    await registry.hold("s", "r2")
    await backend.marker.look()
    sent: list[tuple[object, ...]] = []
    wire = backend._wire
    command, call = wire.command, wire.call

    async def spy(parts: tuple[object, ...]) -> object:
        sent.append(parts)
        return await command(parts)

    async def spy_call(packet: bytes, parts: Callable[[], Sequence[object]]) -> object:
        sent.append(tuple(parts()))
        return await call(packet, parts)

    wire.command = spy  # type: ignore[method-assign]
    wire.call = spy_call  # type: ignore[method-assign]
    assert await registry.end_session("s") == frozenset({"r2"})
    # one call, naming the record and the marker (the count is not a call of its own)
    assert len(sent) == 1 and sent[0][2:4] == (2, keys.registry(backend.key_base("s")))
    assert sent[0][4] == KEY and backend.marker.count == 1
    assert int(await client.hget(KEY, "n") or 0) == 1
    assert await registry.end_session("s") is None  # nothing left: nothing counted
    assert int(await client.hget(KEY, "n") or 0) == 1

    await registry.put_session("s", {"version": "v"}, 60)
    await registry.hold("s", "r3")
    await client.hset(KEY, "n", "not a count")
    assert await registry.end_session("s") == frozenset({"r3"})  # ended all the same
    assert await registry.get_session("s") is None
    assert "was not counted" in caplog.text

"""The task store contract, run against memory, fakeredis, a real Redis, Valkey and a Cluster.

Every rule of :mod:`replaystore.taskstore.store` is checked here on each backend:
atomic terminal states, input keys unique for the task's life, answers that
are ignored unless outstanding, the runner's lease, the TTL, owners.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from fakeredis import FakeAsyncRedis, FakeServer

from replaystore import ReplayBuffer
from replaystore.backends.coordination import coordination_of
from replaystore.errors import StorageError
from replaystore.taskstore import (
    LOST_ERROR,
    OUTAGE_ERROR,
    NotReplicatedError,
    TaskInputError,
    TaskStore,
    new_task_id,
    valid_task_id,
)
from replaystore.taskstore.records import MAX_BLOB
from replaystore.testing.servers import redis_server_binary, start_standalone
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.anyio

KINDS = ["memory", "fakeredis", "redis", "valkey", "cluster"]

MakeStore = Callable[[], Awaitable[TaskStore]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=KINDS)
async def make_store(
    request: pytest.FixtureRequest, real_servers: RealServers
) -> AsyncIterator[MakeStore]:
    """``await make_store()``: a store; stores made in one test are replicas of one another."""
    kind = request.param
    prefix = f"t{uuid.uuid4().hex[:10]}:"
    fake = FakeServer()
    buffers: list[ReplayBuffer] = []

    async def factory() -> TaskStore:
        if kind == "memory":
            buffer = ReplayBuffer.from_url(f"memory://{prefix}")
        elif kind == "fakeredis":
            buffer = ReplayBuffer.from_url(
                "redis://", prefix=prefix, client=FakeAsyncRedis(server=fake)
            )
        else:
            buffer = ReplayBuffer.from_url(real_servers.shared(kind).url, prefix=prefix)
        await buffer.__aenter__()
        buffers.append(buffer)
        return coordination_of(buffer.backend).task_store()

    yield factory
    for buffer in buffers:
        await buffer.aclose()


async def _two(make_store: MakeStore) -> tuple[TaskStore, TaskStore]:
    return await make_store(), await make_store()


async def test_a_created_task_resolves_on_another_replica(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    created = await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000, poll_ms=500)
    seen = await b.get(task_id)
    assert seen is not None
    assert seen.status == "working" and seen.created_ms == created.created_ms
    assert seen.detailed() == created.detailed()
    assert seen.detailed()["pollIntervalMs"] == 500 and seen.detailed()["ttlMs"] == 60_000
    assert await b.get(new_task_id()) is None
    with pytest.raises(ValueError, match="taken"):
        await b.create(task_id, runner="r2", lease=5, ttl_ms=60_000)


async def test_a_terminal_status_never_changes(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
    assert await b.cancel(task_id, message="stop")
    ended = await a.get(task_id)
    assert ended is not None and ended.status == "cancelled" and ended.message == "stop"
    # A late result after the cancel, and a second finisher, are refused.
    assert not await a.finish(task_id, "completed", result={"content": []})
    assert not await b.finish(task_id, "failed", error={"code": -32603, "message": "x"})
    assert await b.cancel(task_id)  # known, acknowledged, changes nothing
    after = await b.get(task_id)
    assert after == ended


async def test_racing_finishers_one_wins(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
    wins: list[str] = []

    async def finisher(store: TaskStore, name: str) -> None:
        if await store.finish(task_id, "completed", result={"by": name}):
            wins.append(name)

    async def canceller() -> None:
        assert await b.cancel(task_id)

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(finisher, a if i % 2 else b, f"f{i}")
        tg.start_soon(canceller)
    final = await a.get(task_id)
    assert final is not None and final.terminal
    if final.status == "completed":
        assert final.result is not None and wins == [final.result["by"]]
    else:
        assert final.status == "cancelled" and wins == []


async def test_last_updated_moves_only_on_change(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    created = await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
    await anyio.sleep(0.01)
    beat = await a.beat(task_id, "r1", 5)
    assert beat is not None and beat.status == "working"
    assert await b.respond(task_id, {"r9": {"action": "accept"}})  # not outstanding: ignored
    same = await b.get(task_id)
    assert same is not None and same.updated_ms == created.updated_ms
    await a.ask(task_id, "r1", [{"method": "elicitation/create", "params": {}}])
    changed = await b.get(task_id)
    assert changed is not None and changed.updated_ms > created.updated_ms


async def test_input_requests_and_partial_answers(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
    request = {"method": "elicitation/create", "params": {"message": "name?"}}
    keys = await a.ask(task_id, "r1", [request, request])
    assert keys is not None and len(set(keys)) == 2
    waiting = await b.get(task_id)
    assert waiting is not None and waiting.status == "input_required"
    assert waiting.detailed()["inputRequests"] == {keys[0]: request, keys[1]: request}
    # Another runner cannot ask in this task's name.
    assert await b.ask(task_id, "r2", [request]) is None
    # A partial answer keeps input_required; unknown keys are ignored.
    assert await b.respond(task_id, {keys[0]: {"action": "accept"}, "nope": {"action": "x"}})
    partial = await b.get(task_id)
    assert partial is not None and partial.status == "input_required"
    assert set(partial.input_requests) == {keys[1]}
    # An answered key answered again is ignored.
    assert await b.respond(task_id, {keys[0]: {"action": "decline"}})
    beat = await a.beat(task_id, "r1", 5)
    assert beat is not None and beat.answers == {keys[0]: {"action": "accept"}}
    assert await b.respond(task_id, {keys[1]: {"action": "cancel"}})
    working = await b.get(task_id)
    assert working is not None and working.status == "working"
    assert "inputRequests" not in working.detailed()
    beat = await a.beat(task_id, "r1", 5)
    assert beat is not None and beat.answers == {keys[1]: {"action": "cancel"}}
    again = await a.beat(task_id, "r1", 5)
    assert again is not None and again.answers == {}  # handed over once
    # Keys stay unique for the task's life: new requests never reuse old keys.
    more = await a.ask(task_id, "r1", [request])
    assert more is not None and not set(more) & set(keys)


async def test_a_clients_answer_or_cancel_nudges_the_runner_on_its_replica(
    make_store: MakeStore,
) -> None:
    """An answer taken or a cancel is announced to the task's runner, and to no other."""
    runner_side, client_side = await _two(make_store)
    mine, other = new_task_id(), new_task_id()
    await client_side.create(mine, runner="r1", lease=5, ttl_ms=60_000)
    await client_side.create(other, runner="r2", lease=5, ttl_ms=60_000)
    request = {"method": "elicitation/create", "params": {"message": "name?"}}
    keys = await runner_side.ask(mine, "r1", [request])
    other_keys = await client_side.ask(other, "r2", [request])
    assert keys and other_keys
    heard: list[str] = []
    arrived = anyio.Event()

    def nudge(task_id: str) -> None:
        heard.append(task_id)
        arrived.set()

    async def expect(task_id: str) -> None:
        nonlocal arrived
        with anyio.fail_after(5):
            await arrived.wait()
        assert heard == [task_id]
        heard.clear()
        arrived = anyio.Event()

    async with runner_side.nudges("r1", nudge):
        # Changes that give the runner nothing to do announce nothing: an
        # unknown key, and another runner's task.
        assert await client_side.respond(mine, {"nope": {"action": "accept"}})
        assert await client_side.respond(other, {other_keys[0]: {"action": "accept"}})
        assert await client_side.respond(mine, {keys[0]: {"action": "accept"}})
        await expect(mine)
        assert await client_side.cancel(mine)
        await expect(mine)
        assert await client_side.cancel(mine)  # already ended: nothing to announce
        assert await client_side.cancel(other)
        await anyio.sleep(0.2)
        assert heard == []
    # Closed: nothing is delivered any more.
    third = new_task_id()
    await client_side.create(third, runner="r1", lease=5, ttl_ms=60_000)
    assert await client_side.cancel(third)
    await anyio.sleep(0.2)
    assert heard == []


async def _lapse(wait: float, look: Awaitable[object]) -> None:
    """Let a lease lapse as a dead runner's does: past it, a first ``look`` marks the
    task suspect (one more lease for its runner to renew), then that lease passes too."""
    await anyio.sleep(wait)
    await look
    await anyio.sleep(wait)


async def test_a_lapsed_lease_ends_the_task_failed(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=0.3, ttl_ms=60_000)
    beat = await a.beat(task_id, "r1", 0.3)
    assert beat is not None and beat.status == "working"
    still = await b.get(task_id)
    assert still is not None and still.status == "working"
    await _lapse(0.5, b.get(task_id))
    lost = await b.get(task_id)
    assert lost is not None and lost.status == "failed"
    assert lost.detailed()["error"] == LOST_ERROR
    assert "stopped" in lost.detailed()["statusMessage"]
    # The runner coming back learns it, and cannot overwrite the verdict.
    late = await a.beat(task_id, "r1", 5)
    assert late is not None and late.status == "failed"
    assert not await a.finish(task_id, "completed", result={"content": []})
    again = await a.get(task_id)
    assert again == lost


async def test_a_rerunnable_task_is_claimed_by_one_survivor_then_fails_as_lost(
    make_store: MakeStore,
) -> None:
    a, b, c = await make_store(), await make_store(), await make_store()
    task_id = new_task_id()
    call = {"name": "countdown", "arguments": {"n": 3}}
    await a.create(task_id, runner="r1", lease=0.3, ttl_ms=60_000, attempts=2, call=call)
    assert await b.claim(task_id, "r2", 0.3) is None  # the lease holds: nothing to claim
    assert (await a.ask(task_id, "r1", [{"method": "elicitation/create"}])) == ["r1"]
    await _lapse(0.5, b.get(task_id))
    orphan = await b.get(task_id)
    assert orphan is not None and orphan.status == "input_required" and orphan.rerun
    # Survivors race for it: exactly one takes it over, with the stored call.
    claims: list[dict[str, Any] | None] = [None, None, None]

    async def claim(i: int, store: TaskStore) -> None:
        claims[i] = await store.claim(task_id, f"s{i}", 0.3)

    async with anyio.create_task_group() as group:
        for i, store in enumerate((a, b, c)):
            group.start_soon(claim, i, store)
    won = [i for i, got in enumerate(claims) if got is not None]
    assert len(won) == 1 and claims[won[0]] == call
    rerun = await c.get(task_id)
    assert rerun is not None and rerun.status == "working" and not rerun.rerun
    assert rerun.input_requests == {} and rerun.updated_ms >= orphan.updated_ms
    assert await a.beat(task_id, "r1", 5) is None  # the first runner no longer holds it
    assert (await a.ask(task_id, f"s{won[0]}", [{"m": 1}])) == ["r2"]  # keys never reused
    # Its two runs are spent: the next lapse fails it as lost, and nothing claims it.
    await _lapse(0.5, b.get(task_id))
    lost = await b.get(task_id)
    assert lost is not None and lost.status == "failed" and not lost.rerun
    assert lost.detailed()["error"] == LOST_ERROR
    assert await b.claim(task_id, "s9", 5) is None


async def test_a_task_is_claimed_only_where_its_tool_is_served_until_the_grace_ends(
    make_store: MakeStore,
) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    call = {"name": "countdown", "arguments": {"n": 3}}
    await a.create(task_id, runner="r1", lease=0.2, ttl_ms=60_000, attempts=3, call=call)
    await _lapse(0.4, b.get(task_id))
    # Lapsed, but the claimant does not serve countdown: left for one that does.
    assert await b.claim(task_id, "r2", 5, tools=["lookup"], grace=30) is None
    assert await b.claim(task_id, "r2", 5, tools=[], grace=30) is None
    left = await b.get(task_id)
    assert left is not None and left.status == "working" and left.rerun
    assert await a.claim(task_id, "r3", 0.2, tools=["lookup", "countdown"], grace=30) == call
    # Lapsed again, past the grace: any replica takes it (to fail it as lost).
    await _lapse(0.4, b.get(task_id))
    assert await b.claim(task_id, "r2", 5, tools=["lookup"], grace=0.1) == call


async def test_a_task_without_a_stored_call_is_never_claimed(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=0.2, ttl_ms=60_000, attempts=3)
    await _lapse(0.4, b.get(task_id))
    assert await b.claim(task_id, "r2", 5) is None
    lost = await b.get(task_id)
    assert lost is not None and lost.status == "failed"


async def test_after_the_ttl_the_store_holds_nothing(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=400)
    await a.ask(task_id, "r1", [{"method": "elicitation/create", "params": {}}])
    assert await b.get(task_id) is not None
    await anyio.sleep(0.6)
    assert await b.get(task_id) is None
    assert not await b.respond(task_id, {"r1": {"action": "accept"}})
    assert not await b.cancel(task_id)
    assert await a.beat(task_id, "r1", 5) is None
    client = getattr(a, "_client", None)
    if client is not None:  # nothing left in Redis either
        keys = a.keys(task_id)  # type: ignore[attr-defined]
        assert await client.exists(*keys) == 0


async def test_an_owned_task_is_invisible_to_others(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000, owner="alice")
    assert await b.get(task_id, owner="alice") is not None
    assert await b.get(task_id, owner="mallory") is None
    assert await b.get(task_id) is None
    assert not await b.cancel(task_id, owner="mallory")
    assert not await b.respond(task_id, {"r1": {}}, owner="mallory")
    mine = await b.get(task_id, owner="alice")
    assert mine is not None and mine.status == "working"


async def test_values_too_large_are_refused_before_anything_is_written(
    make_store: MakeStore,
) -> None:
    a, b = await _two(make_store)
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
    keys = await a.ask(task_id, "r1", [{"method": "elicitation/create", "params": {}}])
    assert keys is not None
    huge: dict[str, Any] = {"action": "accept", "content": {"x": "y" * (MAX_BLOB + 1)}}
    with pytest.raises(TaskInputError):
        await b.respond(task_id, {keys[0]: huge})
    with pytest.raises(TaskInputError):
        await a.finish(task_id, "completed", result={"bad": object()})
    task = await b.get(task_id)
    assert task is not None and task.status == "input_required"


def test_task_ids_carry_144_random_bits() -> None:
    ids = {new_task_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(valid_task_id(i) and len(i) == 24 for i in ids)
    for bad in ["", "x", "a" * 23, "{abc}" + "a" * 19, None, 5, "a" * 25]:
        assert not valid_task_id(bad)


async def test_wait_replicas_refuses_a_create_no_replica_acknowledged(
    real_servers: RealServers,
) -> None:
    url = f"{real_servers.shared('redis').url}?prefix=tw{uuid.uuid4().hex[:8]}:"
    async with ReplayBuffer.from_url(url) as buffer:
        coordination = coordination_of(buffer.backend)
        waiting = coordination.task_store(wait_replicas=1, wait_timeout=0.2)
        with pytest.raises(StorageError, match="acknowledged by 0 of 1"):
            await waiting.create(new_task_id(), runner="r1", lease=5, ttl_ms=60_000)
        plain = coordination.task_store()
        task_id = new_task_id()
        await plain.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
        assert await plain.get(task_id) is not None


async def test_wait_replicas_covers_every_status_change(real_servers: RealServers) -> None:
    """Without a replica to acknowledge: a client's change is refused as not replicated
    (yet stands on the primary), the runner's changes stand with a warning."""
    url = f"{real_servers.shared('redis').url}?prefix=tw{uuid.uuid4().hex[:8]}:"
    async with ReplayBuffer.from_url(url) as buffer:
        coordination = coordination_of(buffer.backend)
        waiting = coordination.task_store(wait_replicas=1, wait_timeout=0.1)
        plain = coordination.task_store()
        task_id = new_task_id()
        await plain.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
        assert await waiting.ask(task_id, "r1", [{"m": 1}]) == ["r1"]
        with pytest.raises(NotReplicatedError, match="acknowledged by 0 of 1"):
            await waiting.respond(task_id, {"r1": {"action": "accept"}})
        answered = await plain.get(task_id)
        assert answered is not None and answered.status == "working"
        with pytest.raises(NotReplicatedError):
            await waiting.cancel(task_id)
        cancelled = await plain.get(task_id)
        assert cancelled is not None and cancelled.status == "cancelled"
        other = new_task_id()
        await plain.create(other, runner="r1", lease=5, ttl_ms=60_000)
        assert await waiting.finish(other, "completed", result={"content": []})
        done = await plain.get(other)
        assert done is not None and done.status == "completed"


async def test_wait_replicas_with_a_real_replica_every_change_is_on_it() -> None:
    primary = start_standalone(redis_server_binary(), "redis")
    replica = start_standalone(redis_server_binary(), "redis")
    follower = aioredis.Redis.from_url(replica.url)
    try:
        await follower.replicaof("127.0.0.1", primary.ports[0])
        with anyio.fail_after(10):
            while (await follower.info("replication")).get("master_link_status") != "up":  # noqa: ASYNC110
                await anyio.sleep(0.05)
        async with ReplayBuffer.from_url(
            primary.url, prefix="tr:", wait_replicas=1, wait_timeout=2.0
        ) as buffer:
            store = coordination_of(buffer.backend).task_store(wait_replicas=1, wait_timeout=2.0)
            task_id = new_task_id()
            key = f"tr:{{task:{task_id}}}:task"

            async def on_replica() -> str:
                status = await follower.hget(key, "st")
                return status.decode() if status else ""

            await store.create(task_id, runner="r1", lease=5, ttl_ms=60_000)
            assert await on_replica() == "working"
            await store.ask(task_id, "r1", [{"m": 1}])
            assert await on_replica() == "input_required"
            await store.respond(task_id, {"r1": {"action": "accept"}})
            assert await on_replica() == "working"
            await store.cancel(task_id)
            assert await on_replica() == "cancelled"
    finally:
        await follower.aclose()
        replica.stop()
        primary.stop()


# ---------------------------------------------------------------- background scans


async def _reap_all(store: TaskStore, *, limit: int = 100) -> tuple[list[str], list[str]]:
    """Scan until nothing more is due now: every task ended, every orphan found."""
    failed: list[str] = []
    orphaned: list[str] = []
    while True:
        reaped = await store.reap(limit=limit, hide=5.0)
        failed += reaped.failed
        orphaned += reaped.orphaned
        if reaped.next_in != 0:
            return failed, orphaned


async def test_a_scan_ends_orphaned_tasks_once_however_many_replicas_scan(
    make_store: MakeStore,
) -> None:
    """Nobody reads these tasks: the scans alone end them, each reported by one scanner."""
    runner, *scanners = [await make_store() for _ in range(4)]
    ids = [new_task_id() for _ in range(12)]
    for task_id in ids:
        await runner.create(task_id, runner="r1", lease=0.6, ttl_ms=60_000)
    live = new_task_id()
    await runner.create(live, runner="r1", lease=30, ttl_ms=60_000)
    early = await scanners[0].reap()
    assert early.failed == [] and early.orphaned == []
    # The first look must come within a lease of the lapse (later, it reads as
    # a store outage): half a lease of margin on a loaded machine.
    await _lapse(0.7, _reap_all(scanners[0]))
    results: list[tuple[list[str], list[str]]] = []

    async def scan(store: TaskStore) -> None:
        results.append(await _reap_all(store, limit=5))

    async with anyio.create_task_group() as group:
        for store in scanners:
            group.start_soon(scan, store)
    failed = [task_id for found, _ in results for task_id in found]
    assert sorted(failed) == sorted(ids)  # each exactly once, over all scanners
    assert all(orphans == [] for _, orphans in results)
    for task_id in ids:
        record = await runner.get(task_id)
        assert record is not None and record.status == "failed"
        assert record.detailed()["error"] == LOST_ERROR
    still = await runner.get(live)
    assert still is not None and still.status == "working"
    # What is left to watch is the live task, due when its lease may lapse.
    after = await scanners[0].reap()
    assert after.failed == [] and after.next_in is not None and 0 < after.next_in <= 30


async def test_a_scan_leaves_running_tasks_alone_and_forgets_ended_ones(
    make_store: MakeStore,
) -> None:
    a, b = await _two(make_store)
    assert (await b.reap()).next_in is None  # nothing running: nothing to look at
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=0.4, ttl_ms=60_000)
    for _ in range(4):  # the runner keeps renewing; scans in between change nothing
        await anyio.sleep(0.2)
        assert await a.beat(task_id, "r1", 0.4) is not None
        reaped = await b.reap()
        assert reaped.failed == [] and reaped.orphaned == []
        assert reaped.next_in is not None and reaped.next_in <= 0.4
    record = await b.get(task_id)
    assert record is not None and record.status == "working"
    assert await a.finish(task_id, "completed", result={"content": []})
    await anyio.sleep(0.5)
    reaped = await b.reap()
    assert reaped.failed == [] and reaped.next_in is None


async def test_stale_scan_hints_are_harmless(make_store: MakeStore) -> None:
    """Tasks a reader already ended, or that expired, are dropped from the scan, not reported."""
    a, b = await _two(make_store)
    read, expired = new_task_id(), new_task_id()
    await a.create(read, runner="r1", lease=0.2, ttl_ms=60_000)
    await a.create(expired, runner="r1", lease=0.2, ttl_ms=300)
    index = getattr(a, "_index", None)
    ghost = new_task_id()
    if index is not None:  # on Redis: an entry for a task that never existed
        await a._client.zadd(index(), {ghost: 0})  # type: ignore[attr-defined]
    await _lapse(0.5, b.get(read))
    ended = await b.get(read)  # the reader applies the lapse rule first
    assert ended is not None and ended.status == "failed"
    assert await _reap_all(b) == ([], [])
    assert (await b.reap()).next_in is None
    if index is not None:
        assert await a._client.zcard(index()) == 0  # type: ignore[attr-defined]


async def test_a_scan_hands_orphaned_rerunnable_tasks_to_a_claim(make_store: MakeStore) -> None:
    a, b, c = await make_store(), await make_store(), await make_store()
    task_id = new_task_id()
    call = {"name": "countdown", "arguments": {"n": 3}}
    await a.create(task_id, runner="r1", lease=0.3, ttl_ms=60_000, attempts=2, call=call)
    await _lapse(0.5, b.reap())
    reaped = await b.reap(hide=0.3)  # looked at again once the claimant's lease may lapse
    assert reaped.failed == [] and reaped.orphaned == [task_id]
    assert await b.claim(task_id, "r2", 0.3) == call
    assert await c.claim(task_id, "r3", 0.3) is None
    record = await c.get(task_id)
    assert record is not None and record.status == "working"
    # The second run's runner dies too: its two runs are spent, so a scan fails it.
    await _lapse(0.5, _reap_all(c))
    assert await _reap_all(c) == ([task_id], [])
    lost = await a.get(task_id)
    assert lost is not None and lost.status == "failed"


async def test_leases_of_many_tasks_are_renewed_at_once(make_store: MakeStore) -> None:
    a, b = await _two(make_store)
    mine, theirs, gone = new_task_id(), new_task_id(), new_task_id()
    await a.create(mine, runner="r1", lease=0.4, ttl_ms=60_000)
    await a.create(theirs, runner="r2", lease=5, ttl_ms=60_000)
    (key,) = await a.ask(mine, "r1", [{"method": "elicitation/create"}]) or [""]
    await b.respond(mine, {key: {"action": "accept"}})
    assert await a.beat_many([], "r1", 0.4) == []
    for _ in range(3):
        await anyio.sleep(0.2)
        beats = await a.beat_many([mine, theirs, gone], "r1", 0.4)
        assert beats[1] is None and beats[2] is None
        assert beats[0] is not None and beats[0].status == "working"
        if _ == 0:  # the answer is handed over once
            assert beats[0].answers == {key: {"action": "accept"}}
        else:
            assert beats[0].answers == {}
    record = await b.get(mine)
    assert record is not None and record.status == "working"
    await b.cancel(mine)
    [ended] = await a.beat_many([mine], "r1", 0.4)
    assert ended is not None and ended.status == "cancelled"


async def test_the_runner_holding_a_task_renews_it_after_a_lapse_nobody_judged_yet(
    make_store: MakeStore,
) -> None:
    """A store stall, as the store sees it: the lease lapsed while nobody could look.

    The first look after it only marks the task suspect; the runner, alive,
    renews it (although its lease lapsed) before a second look could judge it.
    """
    a, b = await _two(make_store)
    task_id = new_task_id()
    await a.create(task_id, runner="r1", lease=0.3, ttl_ms=60_000)
    await anyio.sleep(0.5)  # the stall: no renewal reached the store
    looked = await b.get(task_id)
    assert looked is not None and looked.status == "working"
    beat = await a.beat(task_id, "r1", 0.3)
    assert beat is not None and beat.status == "working"
    await anyio.sleep(0.2)
    assert await a.beat(task_id, "r1", 0.3) is not None
    assert await a.finish(task_id, "completed", result={"content": []}, runner="r1")
    done = await b.get(task_id)
    assert done is not None and done.status == "completed"


async def test_a_run_whose_task_was_taken_over_cannot_store_its_end(
    make_store: MakeStore,
) -> None:
    """Fencing: once another replica claimed the task, the first run's end is refused."""
    a, b = await _two(make_store)
    task_id = new_task_id()
    call = {"name": "countdown", "arguments": {"n": 3}}
    await a.create(task_id, runner="r1", lease=0.3, ttl_ms=60_000, attempts=2, call=call)
    await _lapse(0.5, b.get(task_id))
    assert await b.claim(task_id, "r2", 5) == call
    stale = {"content": [{"type": "text", "text": "first run"}]}
    assert not await a.finish(task_id, "completed", result=stale, runner="r1")
    still = await b.get(task_id)
    assert still is not None and still.status == "working"
    fresh = {"content": [{"type": "text", "text": "second run"}]}
    assert await b.finish(task_id, "completed", result=fresh, runner="r2")
    done = await a.get(task_id)
    assert done is not None and done.result == fresh


async def test_a_released_task_is_claimed_at_once_and_the_handed_over_run_is_free(
    make_store: MakeStore,
) -> None:
    """A replica shutting down releases its task (a lease of 0): claimable with no lease to
    wait out, and the run handed over does not use up one of the task's attempts."""
    a, b = await _two(make_store)
    task_id = new_task_id()
    call = {"name": "countdown", "arguments": {"n": 3}}
    await a.create(task_id, runner="r1", lease=30, ttl_ms=60_000, attempts=2, call=call)
    for runner, claimant in (("r1", "r2"), ("r2", "r3"), ("r3", "r4")):
        assert await b.beat(task_id, runner, 0.0) is not None  # released
        orphan = await b.get(task_id)
        assert orphan is not None and orphan.rerun
        assert await b.claim(task_id, claimant, 30) == call


async def test_a_task_lost_through_a_store_outage_says_so(make_store: MakeStore) -> None:
    """The failure tells a store outage from a stopped replica.

    A lapse nobody could see for more than a lease after it happened (the
    store answered no one) and no renewal afterwards: the task fails naming
    the store. A lapse seen at once, then a silent runner: "stopped".
    """
    a, b = await _two(make_store)
    outage, stopped = new_task_id(), new_task_id()
    await a.create(outage, runner="r1", lease=0.3, ttl_ms=60_000)
    await anyio.sleep(0.8)  # lapsed at 0.3, unseen until now: more than a lease late
    await _lapse(0.4, b.get(outage))
    failed = await b.get(outage)
    assert failed is not None and failed.status == "failed"
    assert failed.detailed()["error"] == OUTAGE_ERROR
    assert "store" in failed.detailed()["statusMessage"]
    await a.create(stopped, runner="r1", lease=0.3, ttl_ms=60_000)
    await _lapse(0.4, b.get(stopped))
    lost = await b.get(stopped)
    assert lost is not None and lost.detailed()["error"] == LOST_ERROR

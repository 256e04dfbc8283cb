"""Tasks through everyday operations: a graceful stop, a rolling restart, a stalled Redis.

Real ``replaystore example-server`` processes on a real Redis. A
replica sent ``SIGTERM`` lets its running tasks go on for ``--drain-seconds``
and then hands the rest over (an idempotent tool's task is run again by
another replica, any other ends ``failed`` saying the server shut down); a
Redis that stops answering for longer than a lease fails no task whose
replica is alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from replaystore.testing.servers import ServerHandle
from tests.mcp._support import ServerProcess, spawn_replica, wait_ready
from tests.mcp.tasks._support import Modern, _task_field, _text
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.anyio

ENDS = ("completed", "failed", "cancelled")


async def _stop(replica: ServerProcess) -> None:
    """SIGTERM, then wait (in a worker thread) for the process to exit by itself."""
    replica.proc.send_signal(signal.SIGTERM)
    await anyio.to_thread.run_sync(replica.proc.wait, 60)


async def test_a_task_that_ends_within_the_drain_period_completes(
    mcp_redis: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    """SIGTERM with ``--drain-seconds 10`` while ``countdown`` has about 1.4 s left: ``done``."""
    store = f"{mcp_redis.url}?prefix=tdrain1:"
    options = ("--drain-seconds", "10")
    stopping, reader = (spawn_replica(f"tdrain1-{i}", store, tmp_path, *options) for i in range(2))
    try:
        wait_ready([stopping, reader])
        created = await Modern(fresh, stopping.url).call("countdown", {"n": 20, "interval_ms": 100})
        task_id = created["taskId"]
        await anyio.sleep(0.6)
        await _stop(stopping)
        done = await Modern(fresh, reader.url).wait(task_id, *ENDS)
        assert done["status"] == "completed", done
        assert _text(done) == "done 20"
        assert _task_field(mcp_redis.url, task_id, "att") == b"1"  # it ran once, to its end
    finally:
        stopping.stop()
        reader.stop()


async def test_what_outlasts_the_drain_is_handed_over_without_waiting_for_the_lease(
    mcp_redis: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    """Past the drain: ``countdown`` (idempotent) runs again elsewhere, ``ask`` fails saying why.

    Leases of 30 s: a task left to a lapsing lease would outlast the hang
    guard of the wait, so the handover is what ends or moves these tasks.
    """
    store = f"{mcp_redis.url}?prefix=tdrain2:"
    options = ("--drain-seconds", "1", "--lease-seconds", "30")
    stopping, survivor = (
        spawn_replica(f"tdrain2-{i}", store, tmp_path, *options) for i in range(2)
    )
    try:
        wait_ready([stopping, survivor])
        on_stopping = Modern(fresh, stopping.url)
        counting = (await on_stopping.call("countdown", {"n": 40, "interval_ms": 100}))["taskId"]
        asking = (await on_stopping.call("ask", {}))["taskId"]
        on_survivor = Modern(fresh, survivor.url)
        await on_survivor.wait(asking, "input_required")
        await _stop(stopping)
        failed = await on_survivor.wait(asking, *ENDS)
        assert failed["status"] == "failed", failed
        assert "shut down" in failed["error"]["message"]
        assert "shut down" in failed["statusMessage"]
        done = await on_survivor.wait(counting, *ENDS)
        assert done["status"] == "completed", done
        assert _text(done) == "done 40"
        assert _task_field(mcp_redis.url, counting, "att") == b"2"  # run again, once
    finally:
        stopping.stop()
        survivor.stop()


async def test_a_rolling_restart_of_every_replica_fails_no_idempotent_task(
    mcp_redis: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    """Three replicas, each stopped in turn (SIGTERM, drain 1 s) and replaced, under tasks.

    Every replica runs ``countdown`` tasks longer than the drain when it is
    stopped; clients poll every task through the replicas still up. Each task
    ends ``completed`` with its full count: none is failed by the restarts.
    """
    store = f"{mcp_redis.url}?prefix=troll:"
    options = ("--drain-seconds", "1")
    counter = iter(range(100))

    def spawn() -> ServerProcess:
        return spawn_replica(f"troll-{next(counter)}", store, tmp_path, *options)

    replicas = [spawn() for _ in range(3)]
    everything = list(replicas)
    tasks: list[str] = []
    ends: dict[str, dict[str, Any]] = {}
    try:
        wait_ready(replicas)

        async def poll_all(until: anyio.Event) -> None:
            """Clients polling their tasks, on whichever replica is up (as a balancer routes)."""
            turn = 0
            while not until.is_set() or len(ends) < len(tasks):
                for task_id in [t for t in tasks if t not in ends]:
                    turn += 1
                    up = [r for r in replicas if r.proc.poll() is None]
                    try:
                        task = await Modern(fresh, up[turn % len(up)].url).get(task_id)
                    except (httpx.TransportError, AssertionError, ValueError):
                        continue  # a replica stopping under the request, or its 503
                    if task["status"] in ENDS:
                        ends[task_id] = task
                await anyio.sleep(0.2)

        restarted = anyio.Event()
        with anyio.fail_after(240):  # a hang guard, not a timing assertion
            async with anyio.create_task_group() as group:
                group.start_soon(poll_all, restarted)
                for _ in range(3):
                    victim = replicas[0]
                    for replica in replicas:
                        for _ in range(2):
                            created = await Modern(fresh, replica.url).call(
                                "countdown", {"n": 25, "interval_ms": 100}
                            )
                            tasks.append(created["taskId"])
                    await anyio.sleep(0.3)
                    await _stop(victim)
                    replicas.remove(victim)
                    fresh_replica = spawn()
                    everything.append(fresh_replica)
                    await anyio.to_thread.run_sync(wait_ready, [fresh_replica])
                    replicas.append(fresh_replica)
                restarted.set()
        statuses = {task_id: ends[task_id]["status"] for task_id in tasks}
        assert [s for s in statuses.values() if s != "completed"] == [], statuses
        assert all(_text(ends[task_id]) == "done 25" for task_id in tasks)
        assert len(tasks) == 18
    finally:
        for replica in everything:
            replica.stop()


@pytest.fixture
def stalling_redis(real_servers: RealServers) -> Iterator[ServerHandle]:
    """A Redis of this test alone: it is frozen (SIGSTOP) and thawed."""
    handle = real_servers.own("redis")
    try:
        yield handle
    finally:
        for pid in handle.pids():
            os.kill(pid, signal.SIGCONT)
        handle.stop()


async def test_a_store_stall_longer_than_a_lease_fails_no_task_of_a_live_replica(
    stalling_redis: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    """Redis frozen for 6 s (leases of 2 s) during ``ask`` and ``countdown`` tasks: none fails.

    Three replicas scan and read throughout; the runners are alive, so once
    Redis answers again they renew their leases before anyone judges them,
    and both tasks end as they would have.
    """
    store = f"{stalling_redis.url}?prefix=tstall:"
    options = ("--lease-seconds", "2")
    replicas = [spawn_replica(f"tstall-{i}", store, tmp_path, *options) for i in range(3)]
    try:
        wait_ready(replicas)
        runner, *others = replicas
        on_runner = Modern(fresh, runner.url)
        asking = (await on_runner.call("ask", {}))["taskId"]
        counting = (await on_runner.call("countdown", {"n": 100, "interval_ms": 100}))["taskId"]
        await Modern(fresh, others[0].url).wait(asking, "input_required")
        [pid] = stalling_redis.pids()

        async def read_throughout(url: str, stop: anyio.Event) -> None:
            """A client polling during the stall: its reads wait, or fail, and go on."""
            while not stop.is_set():
                for task_id in (asking, counting):
                    with contextlib.suppress(httpx.TransportError, ValueError):
                        await Modern(fresh, url).task("tasks/get", task_id)
                await anyio.sleep(0.1)

        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            for replica in replicas:
                group.start_soon(read_throughout, replica.url, stop)
            os.kill(pid, signal.SIGSTOP)
            try:
                await anyio.sleep(6)
            finally:
                os.kill(pid, signal.SIGCONT)
            await anyio.sleep(3)  # readers go on once Redis answers again
            stop.set()
        on_other = Modern(fresh, others[1].url)
        waiting = await on_other.get(asking)
        assert waiting["status"] == "input_required", waiting
        [key] = waiting["inputRequests"]
        answer = {"action": "accept", "content": {"name": "Ada"}}
        reply = await on_other.task("tasks/update", asking, inputResponses={key: answer})
        assert "result" in reply, reply
        answered = await on_other.wait(asking, *ENDS)
        assert answered["status"] == "completed", answered
        assert _text(answered) == "hello Ada"
        counted = await on_other.wait(counting, *ENDS)
        assert counted["status"] == "completed", counted
        assert _text(counted) == "done 100"
        assert _task_field(stalling_redis.url, counting, "att") == b"1"  # never taken over
    finally:
        for replica in replicas:
            replica.stop()

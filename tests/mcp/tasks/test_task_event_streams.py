"""A task's event stream through replicas, cut connections, a killed runner and a paused Redis.

One deployment for the module, all real processes: a Redis of its own (so
that it can be paused), three ``replaystore example-server`` replicas on
it (the third keeps 10 events per task it creates, ``--task-events 10``),
and two ``scripts/round_robin_proxy.py`` in front of all three: one
sending each request to the next replica on a new connection, one that
also cuts every answer at a random byte. A task keeps the retention of the
replica that created it. The last two tests kill the second replica and
stop the first. The client is
:meth:`TaskClient.stream_events`. What is checked, for each task:

- the client gets ``seq`` 0..N once each, in order, and the result ``{}``,
  through 15 and more reconnects with ``after``;
- what it got is what the store holds: a fresh read of the task's events
  gives the same event for every ``seq`` (so no ``seq`` ever named two
  different events, whatever a dying runner or a paused store did);
- the stream ended only when the task was terminal, its last event the
  terminal status ``tasks/get`` shows;
- ``events_gone`` names the earliest event kept; bad cursors get -32602.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from fastmcp import Client

from replaystore.mcp.client import (
    ClientTasks,
    EventsGoneError,
    TaskClient,
    TaskEvent,
    TaskRequestError,
)
from replaystore.mcp.client.task_events import TaskEventStream
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle, find_free_port
from tests.mcp._support import ROOT, ServerProcess, spawn_replica, wait_ready
from tests.plugins.servers import RealServers

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

STATUS = "dev.replaystore/status"
TERMINAL = {"completed", "failed", "cancelled"}
STEP_MS = 50
#: A lapsed runner's task is taken over this soon (the kill test waits for it).
LEASE = "2"
#: The faults strike this long after the task was created: a few of its 20 steps in.
FAULT_AFTER = 0.3
FAULT_STEPS = 20


@dataclass
class Proxy:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_proxy(upstreams: list[ServerProcess], log: Path, *extra: str) -> Proxy:
    port = find_free_port()
    args = [sys.executable, "scripts/round_robin_proxy.py", "--port", str(port), *extra]
    for server in upstreams:
        args += ["--upstream", f"127.0.0.1:{server.port}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, log.read_text()
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return Proxy(port, proc)
        assert time.monotonic() < deadline, "proxy not ready"
        time.sleep(0.05)


@dataclass
class Deployment:
    store: ServerHandle
    replicas: list[ServerProcess]

    @property
    def victim(self) -> ServerProcess:
        """The replica the kill test kills (behind both proxies)."""
        return self.replicas[1]

    @property
    def small(self) -> ServerProcess:
        """The replica whose tasks keep 10 events."""
        return self.replicas[2]

    @property
    def first(self) -> ServerProcess:
        return self.replicas[0]

    plain: Proxy
    cutting: Proxy


@pytest.fixture(scope="module")
def deployment(
    real_servers: RealServers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    logs = tmp_path_factory.mktemp("task-streams")
    store = real_servers.own("redis")
    url = f"{store.url}?prefix=tstream:"
    lease = ("--lease-seconds", LEASE)
    replicas = [spawn_replica(f"r{i}", url, logs, *lease) for i in range(2)]
    replicas.append(spawn_replica("r2", url, logs, *lease, "--task-events", "10"))
    servers = replicas
    proxies: list[Proxy] = []
    try:
        wait_ready(servers)
        proxies.append(start_proxy(replicas, logs / "plain.log"))
        proxies.append(start_proxy(replicas, logs / "cut.log", "--cut-bytes", "900"))
        yield Deployment(store, replicas, *proxies)
    finally:
        for proxy in proxies:
            proxy.stop()
        for server in servers:
            server.stop()
        store.stop()


@contextlib.asynccontextmanager
async def tasks_at(url: str, **options: Any) -> AsyncIterator[TaskClient]:
    """A client opening a new connection per request (the proxy routes each one anew)."""
    http = httpx2.AsyncClient(limits=httpx2.Limits(max_keepalive_connections=0))
    settings: dict[str, Any] = {"backoff": 0.02, "max_backoff": 0.5, "retry_for": 30.0}
    async with http, TaskClient(url, http=http, **{**settings, **options}) as client:
        yield client


async def start_countdown(url: str, n: int, interval_ms: int = STEP_MS) -> str:
    async with tasks_at(url) as client:
        arguments = {"n": n, "interval_ms": interval_ms}
        created = await client.request(
            "tools/call", {"name": "countdown", "arguments": arguments}, "countdown"
        )
    assert created.get("resultType") == "task", created
    return str(created["taskId"])


async def read_all(
    url: str, task_id: str, **options: Any
) -> tuple[list[TaskEvent], TaskEventStream]:
    async with tasks_at(url) as client:
        stream = client.stream_events(task_id, idle_timeout=5.0, **options)
        with anyio.fail_after(60):
            events = [event async for event in stream]
        return events, stream


def shape(events: list[TaskEvent]) -> list[tuple[int, str, dict[str, Any]]]:
    return [(event.seq, event.type, event.payload) for event in events]


async def check_whole(d: Deployment, task_id: str, events: list[TaskEvent]) -> str:
    """Every seq once, in order, as stored, ending on the terminal status tasks/get shows."""
    assert [e.seq for e in events] == list(range(len(events)))
    stored, again = await read_all(d.plain.url, task_id)
    assert again.completed
    assert shape(events) == shape(stored)
    assert events[0].type == STATUS and events[0].payload["status"] == "working"
    last = events[-1]
    assert last.type == STATUS and last.payload["status"] in TERMINAL, last
    async with tasks_at(d.plain.url) as client:
        task = await client.get(task_id)
    assert task["status"] == last.payload["status"]
    return str(task["status"])


def steps(events: list[TaskEvent]) -> list[TaskEvent]:
    return [event for event in events if event.type != STATUS]


async def test_a_40_step_countdown_arrives_once_in_order_through_cut_streams(
    deployment: Deployment,
) -> None:
    task_id = await start_countdown(deployment.first.url, 40)
    events, stream = await read_all(deployment.cutting.url, task_id)
    assert stream.completed
    assert stream.requests >= 16, stream.requests  # 15 reconnects at least
    assert await check_whole(deployment, task_id, events) == "completed"
    assert len(steps(events)) == 40


async def test_events_gone_names_the_earliest_event_kept(deployment: Deployment) -> None:
    task_id = await start_countdown(deployment.small.url, 20, interval_ms=0)
    async with tasks_at(deployment.plain.url) as client:
        await client.wait(task_id)
    kept, stream = await read_all(deployment.plain.url, task_id)  # no cursor: the earliest kept
    assert stream.completed and len(kept) == 10
    earliest = kept[0].seq
    assert earliest > 1 and [e.seq for e in kept] == list(range(earliest, earliest + 10))
    with pytest.raises(EventsGoneError) as gone:
        await read_all(deployment.cutting.url, task_id, after=0)
    assert gone.value.earliest_seq == earliest and gone.value.task_id == task_id
    rest, stream = await read_all(deployment.cutting.url, task_id, after=0, on_gone="earliest")
    assert shape(rest) == shape(kept) and stream.lost == [(1, earliest - 1)]


async def test_bad_cursors_get_invalid_params(deployment: Deployment) -> None:
    task_id = await start_countdown(deployment.first.url, 2, interval_ms=0)
    events, _ = await read_all(deployment.plain.url, task_id)
    last = events[-1].seq
    async with tasks_at(deployment.plain.url) as client:
        for after in (-1, "3", 1.5, True, None, last + 1, 2**70):
            with pytest.raises(TaskRequestError) as refused:
                await client.request("tasks/stream", {"taskId": task_id, "after": after}, task_id)
            assert refused.value.code == -32602, (after, refused.value.error)
        with pytest.raises(TaskRequestError) as unknown:
            await client.request("tasks/stream", {"taskId": "no-such-task"}, "no-such-task")
        assert unknown.value.code == -32602


async def test_a_fastmcp_client_streams_a_tasks_events(deployment: Deployment) -> None:
    created: list[str] = []

    async def save(task_id: str) -> None:
        created.append(task_id)

    tasks = ClientTasks(on_created=save)
    async with Client(deployment.plain.url, extensions=[tasks]) as client:
        await client.call_tool("countdown", {"n": 5, "interval_ms": 0})
        stream = tasks.stream_events(client, created[0])
        events = [event async for event in stream]
    assert stream.completed
    await check_whole(deployment, created[0], events)
    assert [e.payload["step"] for e in steps(events)] == [1, 2, 3, 4, 5]


async def test_a_quiet_tasks_stream_is_reopened_not_failed(deployment: Deployment) -> None:
    """Silent longer than idle_timeout, for longer than retry_for in all: still no failure."""
    task_id = await start_countdown(deployment.first.url, 2, interval_ms=1500)
    async with tasks_at(deployment.plain.url, retry_for=1.0) as client:
        stream = client.stream_events(task_id, idle_timeout=0.5)
        with anyio.fail_after(30):
            events = [event async for event in stream]
    assert stream.completed and stream.requests >= 3
    assert await check_whole(deployment, task_id, events) == "completed"


@contextlib.contextmanager
def paused(store: ServerHandle) -> Iterator[None]:
    pids = store.pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def stream_while(
    url: str, task_id: str, fault: Any
) -> tuple[list[TaskEvent], TaskEventStream]:
    """Stream from ``url``; ``fault()`` runs a moment into the task's run.

    The moment is the task's, not the reader's (a reader through cut
    connections may lag the runner by seconds): the fault hits a running task.
    """
    events: list[TaskEvent] = []
    async with tasks_at(url) as client, anyio.create_task_group() as group:
        stream = client.stream_events(task_id, idle_timeout=5.0)

        async def read() -> None:
            with anyio.fail_after(90):
                async for event in stream:
                    events.append(event)

        group.start_soon(read)
        await anyio.sleep(FAULT_AFTER)
        await fault()
    return events, stream


async def test_a_4s_redis_pause_never_duplicates_skips_or_ends_falsely(
    deployment: Deployment,
) -> None:
    task_id = await start_countdown(deployment.victim.url, FAULT_STEPS)

    async def pause() -> None:
        with paused(deployment.store):
            await anyio.sleep(4)

    events, stream = await stream_while(deployment.cutting.url, task_id, pause)
    assert stream.completed
    await check_whole(deployment, task_id, events)


async def test_a_sigkill_of_the_runner_never_duplicates_skips_or_ends_falsely(
    deployment: Deployment,
) -> None:
    task_id = await start_countdown(deployment.victim.url, FAULT_STEPS)

    async def kill() -> None:
        deployment.victim.proc.send_signal(signal.SIGKILL)
        deployment.victim.proc.wait(5)

    # Through the plain proxy: the kill cuts the streams the runner serves, and a
    # third of the requests meet the dead replica (cutting every answer too is slow).
    events, stream = await stream_while(deployment.plain.url, task_id, kill)
    assert stream.completed
    assert await check_whole(deployment, task_id, events) == "completed"
    # The run after the runner died says so on the stream, and counts again.
    attempts = [e.payload.get("attempt") for e in events if e.type == STATUS]
    assert any(isinstance(a, int) and a >= 2 for a in attempts), shape(events)
    assert steps(events)[-1].payload == {"step": FAULT_STEPS, "left": 0}


async def test_a_stream_a_draining_replica_ends_without_a_result_goes_on_elsewhere(
    deployment: Deployment,
) -> None:
    """SIGTERM: the replica ends its streams early, with no result; that is not the end."""
    draining, other = deployment.first, deployment.small
    # 8 steps: 10 events, all kept by the replica keeping 10 (the runner died in the test above).
    task_id = await start_countdown(other.url, 8, interval_ms=300)
    events: list[TaskEvent] = []
    with TcpProxy([("127.0.0.1", draining.port)]) as proxy:  # the stream opens on ``draining``
        async with tasks_at(f"http://127.0.0.1:{proxy.port}/mcp") as client:
            stream = client.stream_events(task_id, idle_timeout=5.0)
            with anyio.fail_after(60):
                async for event in stream:
                    events.append(event)
                    if len(events) == 2:
                        proxy.set_upstreams([("127.0.0.1", other.port)])
                        draining.proc.send_signal(signal.SIGTERM)
    assert stream.completed and stream.requests >= 2
    assert await check_whole(deployment, task_id, events) == "completed"

"""What ``metrics_path="/metrics"`` shows an operator, scraped from running apps.

A real ``replaystore example-server`` process (built by ``streamable_http_app``
with ``metrics_path``) on a Redis of this module's own: each metric is read
before and after real requests (a session, a running call, a resume, a
listen stream, a task, a store that stops answering) and must move. The
drain, which a process stops serving scrapes at, is read from an app served
in this process.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest
from mcp.server.mcpserver import MCPServer

from replaystore import ReplayBuffer
from replaystore.mcp import metrics, streamable_http_app
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import PV, RawSession, ServerProcess, metric, spawn_replica, wait_ready
from tests.mcp.tasks._support import Modern

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def replica(
    store: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    logs = tmp_path_factory.mktemp("metrics")
    url = f"{store.url}?prefix=met-{uuid.uuid4().hex[:8]}:"
    server = spawn_replica("metrics", url, logs, "--lease-seconds", "2")
    try:
        wait_ready([server])
        yield server
    finally:
        server.stop()


@pytest.fixture
async def scrape(replica: ServerProcess) -> AsyncIterator[Any]:
    async with httpx.AsyncClient(timeout=15) as http:

        async def read() -> str:
            response = await http.get(f"{replica.base}/metrics")
            assert response.status_code == 200
            return response.text

        yield read


async def _until(scrape: Any, name: str, want: float, **labels: str) -> str:
    """Scrape until ``name{labels}`` reads ``want`` (a hang guard, not a timing assertion)."""
    with anyio.fail_after(15):
        while True:
            text: str = await scrape()
            if metric(text, name, **labels) == want:
                return text
            await anyio.sleep(0.05)


async def test_sessions_leases_and_store_round_trips_move_with_requests(
    replica: ServerProcess, scrape: Any
) -> None:
    appends = metrics.STORE_SECONDS + "_count"
    before = await scrape()
    async with httpx.AsyncClient(timeout=15) as http:
        session = await RawSession(http, replica.url).initialize()
        during = ""
        ids: list[str] = []
        _, call = session.call("countdown", {"n": 3, "interval_ms": 400}, token="t")
        async with session.post(call) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("id:"):
                    ids.append(line[3:].strip())
                if len(ids) == 2 and not during:
                    during = await scrape()
        after = await scrape()
        async with session.get(ids[1]) as resumed:  # a resume: a store round trip of its own
            assert resumed.status_code == 200
            await resumed.aread()
        resumed_text = await scrape()
    assert metric(during, metrics.SESSIONS) == metric(before, metrics.SESSIONS) + 1
    assert metric(during, metrics.LEASES, kind="request") == 1
    assert metric(after, metrics.LEASES, kind="request") == 0
    assert (
        metric(after, appends, operation="append")
        >= metric(before, appends, operation="append") + 4
    )  # the session's priming events, three progress notifications, the result
    assert metric(resumed_text, appends, operation="resume") == (
        metric(after, appends, operation="resume") + 1
    )


async def test_listen_streams_and_tasks_are_counted(replica: ServerProcess, scrape: Any) -> None:
    listening = anyio.Event()
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
    }
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "subscriptions/listen",
        "params": {"notifications": {"toolsListChanged": True}, "_meta": meta},
    }
    async with httpx.AsyncClient(timeout=15) as http, anyio.create_task_group() as group:

        async def listen() -> None:
            async with http.stream("POST", replica.url, json=body, headers=headers) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if "notifications/subscriptions/acknowledged" in line:
                        listening.set()

        group.start_soon(listen)
        with anyio.fail_after(15):
            await listening.wait()
        assert metric(await scrape(), metrics.LISTEN_STREAMS) == 1
        group.cancel_scope.cancel()
    await _until(scrape, metrics.LISTEN_STREAMS, 0)

    ends = metrics.TASK_ENDS + "_total"
    before = await scrape()
    async with httpx.AsyncClient(timeout=15) as http:
        client = Modern(http, replica.url)
        created = await client.call("countdown", {"n": 4, "interval_ms": 300})
        task_id = created["task"]["taskId"] if "task" in created else created["taskId"]
        running = await scrape()
        await client.wait(task_id, "completed")
    assert metric(running, metrics.TASKS, state="working") == 1
    assert metric(running, metrics.LEASES, kind="task") == 1
    done = await _until(scrape, metrics.TASKS, 0, state="working")
    assert metric(done, ends, status="completed") == metric(before, ends, status="completed") + 1


async def test_a_store_that_stops_answering_counts_503s_by_reason(
    replica: ServerProcess, store: ServerHandle, scrape: Any
) -> None:
    name = metrics.UNAVAILABLE + "_total"
    before = await scrape()
    (pid,) = store.pids()
    os.kill(pid, signal.SIGSTOP)
    try:
        async with httpx.AsyncClient(timeout=15) as http:
            response = await http.post(
                replica.url,
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": PV,
                        "capabilities": {},
                        "clientInfo": {"name": "metrics", "version": "1"},
                    },
                },
                headers={"Accept": "application/json, text/event-stream"},
            )
            assert response.status_code == 503, response.text
        after = await scrape()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert metric(after, name, reason="store_unreachable") == (
        metric(before, name, reason="store_unreachable") + 1
    )


async def test_a_drain_is_counted_from_start_to_end() -> None:
    """In this process: a stopping server no longer answers scrapes, so the end is read here."""
    app = streamable_http_app(
        MCPServer("drained"), ReplayBuffer.from_url(f"memory://{uuid.uuid4().hex}"),
        metrics_path="/metrics",
    )  # fmt: skip
    drains = metrics.DRAINS + "_total"
    refused = metrics.UNAVAILABLE + "_total"
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
        before = (await http.get("/metrics")).text
        async with app.router.lifespan_context(app):
            session = await RawSession(http, "http://127.0.0.1:8000/mcp").initialize()
            app.state.replaystore.managers[0].drain()
            status = await session.ping_status()
            draining = (await http.get("/metrics")).text
        after = (await http.get("/metrics")).text
    assert status == 503
    assert metric(draining, drains, stage="started") == metric(before, drains, stage="started") + 1
    assert metric(draining, refused, reason="draining") == (
        metric(before, refused, reason="draining") + 1
    )
    assert metric(after, drains, stage="finished") == metric(before, drains, stage="finished") + 1


def test_resumption_metrics_read_as_prometheus_clients_own_would() -> None:
    """The observer's plain-number instruments expose what prometheus_client's own
    Counter and Histogram expose for the same observations (bucket edges included)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    ours, theirs = CollectorRegistry(), CollectorRegistry()
    observer = metrics.PrometheusObserver(ours, buckets=(0.001, 0.01, 0.1))
    counted = Counter("replaystore_mcp_resumptions", "x", ["verdict"], registry=theirs)
    timed = Histogram(
        "replaystore_mcp_replay_seconds",
        "x",
        ["outcome"],
        buckets=(0.001, 0.01, 0.1),
        registry=theirs,
    )
    replayed = Counter("replaystore_mcp_replayed_events", "x", registry=theirs)
    seen = [
        ("resumed", 0.0005, 3),
        ("resumed", 0.001, 2),  # on a bucket's edge: counted in it
        ("below_floor", 0.05, 0),
        (metrics.STORAGE_ERROR, 7.0, 0),  # past every bound: +Inf only
        ("resumed", 0.01, 1),
    ]
    for verdict, seconds, count in seen:
        observer.on_resumption("s", verdict, seconds, count)
        outcome = verdict if verdict in ("resumed", metrics.STORAGE_ERROR) else "failed"
        counted.labels(verdict=verdict).inc()
        timed.labels(outcome=outcome).observe(seconds)
        if count:
            replayed.inc(count)

    def samples(
        registry: CollectorRegistry,
    ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect()
            for s in family.samples
            if not s.name.endswith("_created")
        }

    assert samples(ours) == samples(theirs)
    assert (
        samples(ours)[
            ("replaystore_mcp_replay_seconds_bucket", (("le", "0.001"), ("outcome", "resumed")))
        ]
        == 2
    )

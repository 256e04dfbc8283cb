"""What a replica tells its balancer: the health check, the drain, and store outages.

The drain is driven in-process (``ReplaySessionManager.drain()``, what the
example server calls on ``SIGTERM``): uvicorn closes its listener at once on
the signal, so a draining replica's answers are only observable from inside.
The outages use a real Redis behind a proxy that stops answering.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from replaystore.mcp import manager_of
from replaystore.mcp.example import build_app
from replaystore.testing.mcp import initialize_message
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle, find_free_port
from tests.mcp._support import (
    PV,
    RawSession,
    ServerProcess,
    progress_of,
    result_text,
    served_in_loop,
    spawn_replica,
    sse_events,
    wait_ready,
)

pytestmark = pytest.mark.anyio

INITIALIZE = initialize_message()
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, object]]:
    """The example app in this event loop (so the test can drain its manager)."""
    app = build_app("memory://ops-drain")
    async with served_in_loop(app) as port:
        yield f"http://127.0.0.1:{port}", manager_of(app)


async def test_health_check_answers_without_the_transport_checks(
    served: tuple[str, object],
) -> None:
    base, _ = served
    async with httpx.AsyncClient(timeout=10) as http:
        # A Host the MCP endpoint refuses (421), no Accept: the health check answers all the same.
        answer = await http.get(f"{base}/healthz", headers={"host": "mcp", "accept": ""})
        assert answer.status_code == 200 and answer.text.startswith("ok: replica ")
        assert answer.headers["cache-control"] == "no-store"
        assert (await http.head(f"{base}/healthz")).status_code == 200
        refused = await http.post(
            f"{base}/mcp", json=INITIALIZE, headers={**HEADERS, "host": "mcp"}
        )
        assert refused.status_code == 421


async def test_a_draining_replica_refuses_new_work_and_finishes_running_calls(
    served: tuple[str, object],
) -> None:
    base, manager = served
    async with httpx.AsyncClient(timeout=20) as http:
        session = await RawSession(http, f"{base}/mcp").initialize()
        other = await RawSession(http, f"{base}/mcp").initialize()
        request_id, body = session.call("countdown", {"n": 10, "interval_ms": 50}, token="t")
        progress: list[float] = []
        result = None
        async with session.post(body) as running:
            events = sse_events(running)
            async for event in events:
                if (value := progress_of(event)) is not None:
                    progress.append(value)
                    break
            manager.drain()  # type: ignore[attr-defined]

            health = await http.get(f"{base}/healthz")
            assert health.status_code == 503 and health.text.startswith("draining")
            for refused in (
                await http.post(f"{base}/mcp", json=INITIALIZE, headers=HEADERS),
                await http.post(
                    other.url, json=other.request("tools/list", {})[1], headers=other.headers()
                ),
            ):
                assert refused.status_code == 503, refused.text
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["data"]["reason"] == "draining"
            get_headers = other.headers(accept="text/event-stream")
            get_headers.pop("content-type")
            assert (await http.get(other.url, headers=get_headers)).status_code == 503
            # A notification is no new work: still taken.
            note = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
            accepted = await http.post(other.url, json=note, headers=other.headers())
            assert accepted.status_code == 202

            with anyio.fail_after(10):
                async for event in events:
                    if (value := progress_of(event)) is not None:
                        progress.append(value)
                    if (text := result_text(event, request_id)) is not None:
                        result = text
                        break
    assert result == "done 10"
    assert progress == [float(i) for i in range(1, 11)]


# ---------------------------------------------------------------- store outages


@pytest.fixture(scope="module")
def store_proxy(mcp_redis: ServerHandle) -> Iterator[TcpProxy]:
    with TcpProxy([("127.0.0.1", mcp_redis.ports[0])]) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def proxied(
    store_proxy: TcpProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    logs: Path = tmp_path_factory.mktemp("ops")
    options = ("--log-level", "info", "--ping-seconds", "1")
    server = spawn_replica("ops", f"{store_proxy.url()}?prefix=ops:", logs, *options)
    try:
        wait_ready([server])
        yield server
    finally:
        server.stop()


async def test_initialize_in_a_store_outage_is_503_within_the_store_timeout(
    proxied: ServerProcess, store_proxy: TcpProxy
) -> None:
    async with httpx.AsyncClient(timeout=20) as http:
        store_proxy.pause()  # the store stops answering (a partition, not a refusal)
        try:
            started = time.monotonic()
            answer = await http.post(proxied.url, json=INITIALIZE, headers=HEADERS)
            took = time.monotonic() - started
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "1"
            assert answer.json()["error"]["data"]["reason"] == "storage_error"
            assert took < 3, took  # store_timeout is 1 s
            health = await http.get(f"{proxied.base}/healthz")
            assert health.status_code == 503 and "replay store" in health.text
            # A session this replica never served: looking it up needs the store.
            unknown = {**HEADERS, "mcp-session-id": "ab" * 16, "mcp-protocol-version": PV}
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            lookup = await http.post(proxied.url, json=body, headers=unknown)
            assert lookup.status_code == 503
        finally:
            store_proxy.resume()
        assert (await RawSession(http, proxied.url).initialize()).session_id
        assert (await http.get(f"{proxied.base}/healthz")).status_code == 200
    log = proxied.log_path.read_text(errors="replace")
    assert "did not answer within 1 s" in log
    assert "cannot be reached ()" not in log


async def test_idle_streams_carry_a_keep_alive_at_the_set_interval(proxied: ServerProcess) -> None:
    """``--ping-seconds 1``: an idle GET stream carries a comment every second (default 15)."""
    async with httpx.AsyncClient(timeout=20) as http:
        session = await RawSession(http, proxied.url).initialize()
        pings = 0
        with anyio.move_on_after(2.6):
            async with session.get() as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    pings += line.startswith(": ping")
    assert pings >= 2, pings


async def _down(proxy: TcpProxy, seconds: float, store: ServerHandle) -> None:
    """The store goes down (refused, every connection cut) for ``seconds``, then comes back."""
    upstream = [("127.0.0.1", store.ports[0])]
    proxy.set_upstreams([])
    proxy.sever_all()
    try:
        await anyio.sleep(seconds)
    finally:
        proxy.set_upstreams(upstream)


async def test_a_short_store_outage_is_ridden_out_by_the_running_call(
    proxied: ServerProcess, store_proxy: TcpProxy, mcp_redis: ServerHandle
) -> None:
    async with httpx.AsyncClient(timeout=20) as http:
        session = await RawSession(http, proxied.url).initialize()
        request_id, body = session.call("countdown", {"n": 20, "interval_ms": 100}, token="t")
        progress: list[float] = []
        result = None
        with anyio.fail_after(20):
            async with session.post(body) as response, anyio.create_task_group() as tg:
                async for event in sse_events(response):
                    if (value := progress_of(event)) is not None:
                        progress.append(value)
                        if value == 3.0:
                            tg.start_soon(_down, store_proxy, 1.0, mcp_redis)
                    if (text := result_text(event, request_id)) is not None:
                        result = text
                        break
    assert result == "done 20"
    assert progress == [float(i) for i in range(1, 21)]


async def test_a_call_stopped_by_a_long_outage_says_the_store_was_unreachable(
    proxied: ServerProcess, store_proxy: TcpProxy, mcp_redis: ServerHandle
) -> None:
    """Past the wait (half the lease), the call ends; its error names the store, not a replica."""
    async with httpx.AsyncClient(timeout=20) as http:
        session = await RawSession(http, proxied.url).initialize()
        request_id, body = session.call("countdown", {"n": 100, "interval_ms": 50}, token="t")
        last = ""
        ended: dict[str, Any] | None = None
        with anyio.fail_after(20):
            async with session.post(body) as response, anyio.create_task_group() as tg:
                async for event in sse_events(response):
                    if progress_of(event) is not None:
                        last = event.id or last
                        if progress_of(event) == 3.0:
                            tg.start_soon(_down, store_proxy, 4.0, mcp_redis)
                    ended = event.message
        assert last
        # The POST stream itself ends with the call's error, not cut nor silent.
        assert ended is not None and ended.get("id") == request_id, ended
        assert "replay store did not answer" in ended["error"]["message"], ended
        final = None
        with anyio.fail_after(20):
            while final is None:
                async with session.get(last) as resumed:
                    if resumed.status_code == 503:
                        await anyio.sleep(0.5)
                        continue
                    assert resumed.status_code == 200, await resumed.aread()
                    async for event in sse_events(resumed):
                        if event.id and event.message is not None:
                            last = event.id
                        if event.message and event.message.get("id") == request_id:
                            final = event.message
                            break
    assert "replay store could not be reached" in final["error"]["message"], final


async def test_fastmcp_apps_answer_the_health_check_too() -> None:
    from fastmcp import FastMCP

    from replaystore import ReplayBuffer
    from replaystore.mcp import fastmcp_http_app

    app = fastmcp_http_app(FastMCP("health"), ReplayBuffer.from_url("memory://ops-fastmcp"))
    port = find_free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        try:
            with anyio.fail_after(20):
                while not server.started:  # noqa: ASYNC110 - uvicorn offers no event
                    await anyio.sleep(0.02)
            async with httpx.AsyncClient(timeout=10) as http:
                answer = await http.get(f"http://127.0.0.1:{port}/healthz")
            assert answer.status_code == 200 and answer.text.startswith("ok: replica ")
        finally:
            server.should_exit = True


async def test_a_post_reaching_a_replica_that_just_let_its_session_go_is_503_then_served(
    mcp_redis: ServerHandle,
) -> None:
    """The session is dropped here while a POST waits for the store: 503, and a retry runs.

    The POST waits on its lease (the store is paused); meanwhile the replica
    forgets its copy of the session (what it does when told the session
    ended elsewhere, or when the store failed under it). The POST is answered
    ``503 session_dropped`` with ``Retry-After``, never cut; the lease it took
    is given back, so the same POST sent again is served afresh (the replica
    adopts the session from the store again) and runs: it did not run before.
    """
    with TcpProxy([("127.0.0.1", mcp_redis.ports[0])]) as proxy:
        app = build_app(f"{proxy.url()}?prefix=dropped:")
        port = find_free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            try:
                with anyio.fail_after(20):
                    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event
                        await anyio.sleep(0.02)
                manager = manager_of(app)
                async with httpx.AsyncClient(timeout=20) as http:
                    session = await RawSession(http, f"http://127.0.0.1:{port}/mcp").initialize()
                    request_id, body = session.call("countdown", {"n": 3, "interval_ms": 0})
                    answers: list[httpx.Response] = []

                    async def post() -> None:
                        answers.append(
                            await http.post(session.url, json=body, headers=session.headers())
                        )

                    proxy.pause()
                    try:
                        async with anyio.create_task_group() as posting:
                            posting.start_soon(post)
                            await anyio.sleep(0.3)  # the POST waits for its lease
                            manager.ended_elsewhere(session.session_id)
                            await anyio.sleep(0.2)
                            proxy.resume()  # within the store timeout (1 s)
                    finally:
                        proxy.resume()
                    (refused,) = answers
                    assert refused.status_code == 503, refused.text
                    assert refused.headers["retry-after"] == "1"
                    assert refused.json()["error"]["data"]["reason"] == "session_dropped"
                    # The retry the 503 asks for: the same request, served afresh.
                    with anyio.fail_after(15):
                        async with session.post(body) as response:
                            assert response.status_code == 200, await response.aread()
                            texts = [
                                text
                                async for event in sse_events(response)
                                if (text := result_text(event, request_id)) is not None
                            ]
                    assert texts == ["done 3"]
            finally:
                server.should_exit = True


async def test_a_post_sent_again_whose_stream_lost_its_start_is_409_and_not_run() -> None:
    """The session's oldest events were evicted: the stream cannot be replayed from its start.

    The request is not run again either: the answer is 409 with the reason
    ``request_received``, and nothing more is stored for the request.
    """
    app = build_app("memory://ops-evicted", max_events=5)
    port = find_free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        try:
            with anyio.fail_after(20):
                while not server.started:  # noqa: ASYNC110 - uvicorn offers no event
                    await anyio.sleep(0.02)
            buffer = manager_of(app)._replay_store.buffer
            async with httpx.AsyncClient(timeout=20) as http:
                session = await RawSession(http, f"http://127.0.0.1:{port}/mcp").initialize()
                request_id, body = session.call("countdown", {"n": 10, "interval_ms": 0}, "e")
                async with session.post(body) as response:
                    async for event in sse_events(response):
                        if result_text(event, request_id) is not None:
                            break
                before = await buffer.session_info(session.session_id)
                again = await http.post(session.url, json=body, headers=session.headers())
                assert again.status_code == 409, again.text
                assert again.json()["error"]["data"]["reason"] == "request_received"
                after = await buffer.session_info(session.session_id)
                assert before is not None and after is not None
                assert after.high_water == before.high_water  # nothing ran, nothing stored
        finally:
            server.should_exit = True

"""Faults and odd input over HTTP, against real example servers on a real Redis.

Large results, long request ids, a store that stops answering, shutdown with
the store gone, a tool still running after its session ended, and a UTF-8
``Last-Event-ID``: each answered without losing the session (or with a clear
verdict), with bounded logs.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
import pytest

from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import (
    RawSession,
    ServerProcess,
    progress_of,
    spawn_replica,
    sse_events,
    wait_ready,
)

pytestmark = pytest.mark.anyio

#: The payload limit of the servers here: small, so that a large message is cheap to make.
MAX_PAYLOAD = 65_536


@pytest.fixture(scope="module")
def store_proxy(mcp_redis: ServerHandle) -> Iterator[TcpProxy]:
    """A proxy between one server and Redis, to make the store stop answering."""
    host, port = "127.0.0.1", mcp_redis.ports[0]
    with TcpProxy([(host, port)]) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def servers(
    mcp_redis: ServerHandle, store_proxy: TcpProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    logs = tmp_path_factory.mktemp("faults-http")
    options = ("--max-payload", str(MAX_PAYLOAD), "--log-level", "info")
    started = {
        "plain": spawn_replica("plain", f"{mcp_redis.url}?prefix=fh:", logs, *options),
        "proxied": spawn_replica("proxied", f"{store_proxy.url()}?prefix=fp:", logs, *options),
    }
    try:
        wait_ready(list(started.values()))
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0)) as client:
        yield client


def _log_lines(server: ServerProcess) -> list[str]:
    return server.log_path.read_text(errors="replace").splitlines()


async def test_a_result_above_the_payload_limit_keeps_the_session(
    servers: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    """An "Unknown tool" error echoing a huge name: answered, and the session lives on."""
    session = await RawSession(http, servers["plain"].url).initialize()
    request_id, body = session.call("x" * (MAX_PAYLOAD * 2), {})
    events = []
    async with session.post(body) as response:
        assert response.status_code == 200
        async for event in sse_events(response):
            events.append(event)
            if event.message and event.message.get("id") == request_id:
                break
    # A client resuming the stream gets an answer for the request, not a gap.
    priming = next(e.id for e in events if e.priming and e.id)
    async with session.get(priming) as response:
        assert response.status_code == 200
        replayed = [e.message async for e in sse_events(response) if e.message]
    assert [m["id"] for m in replayed] == [request_id]
    assert "size limit" in replayed[0]["error"]["message"]
    assert await session.ping_status() == 200
    assert await session.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"


@pytest.mark.parametrize("length", [300, 2_000_000])
async def test_long_request_ids_work_with_bounded_logs(
    servers: dict[str, ServerProcess], http: httpx.AsyncClient, length: int
) -> None:
    server = servers["plain"]
    session = await RawSession(http, server.url).initialize()
    before = len(_log_lines(server))
    long_id = "i" * length
    body = {
        "jsonrpc": "2.0",
        "id": long_id,
        "method": "tools/call",
        "params": {"name": "countdown", "arguments": {"n": 2, "interval_ms": 0}},
    }
    text = None
    async with session.post(body) as response:
        assert response.status_code == 200
        async for event in sse_events(response):
            message = event.message
            if message and message.get("id") == long_id:
                text = message["result"]["content"][0]["text"]
                break
    assert text == "done 2"
    assert await session.ping_status() == 200
    added = _log_lines(server)[before:]
    assert len(added) < 50
    assert not any("Traceback" in line for line in added)
    assert all(len(line) < 10_000 for line in added)


async def test_post_during_a_store_outage_gets_503_and_the_session_survives(
    servers: dict[str, ServerProcess], store_proxy: TcpProxy, http: httpx.AsyncClient
) -> None:
    session = await RawSession(http, servers["proxied"].url).initialize()
    _, body = session.call("countdown", {"n": 1, "interval_ms": 0})
    store_proxy.pause()  # the store stops answering (a partition, not a refusal)
    try:
        with anyio.fail_after(15):  # a hang guard: the server answers within its store timeout
            response = await http.post(session.url, json=body, headers=session.headers())
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["data"]["reason"] == "storage_error"
    finally:
        store_proxy.resume()
    # Kept in the process and in the store: the same session works again.
    assert await session.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"


async def test_a_tool_still_running_after_a_failed_resume_logs_one_info_line(
    servers: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    server = servers["plain"]
    session = await RawSession(http, server.url).initialize()
    before = len(_log_lines(server))
    _, body = session.call("countdown", {"n": 40, "interval_ms": 25}, token="t")
    async with session.post(body) as response:
        async for event in sse_events(response):
            if progress_of(event) == 2.0:
                break
    async with session.get("000000000000-3") as failed:  # a foreign cursor: torn down
        assert failed.status_code == 404
    await anyio.sleep(1.5)  # the tool keeps running (and producing) meanwhile
    added = _log_lines(server)[before:]
    assert not any("Traceback" in line or " ERROR " in line for line in added)
    # Whatever the tool still tried to store is said once at most, at INFO.
    assert sum("ended while a request still ran" in line for line in added) <= 1


async def test_a_utf8_last_event_id_is_shown_as_written(
    servers: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    session = await RawSession(http, servers["plain"].url).initialize()
    headers = session.headers(accept="text/event-stream")
    headers.pop("content-type")
    raw = {**{k: v.encode() for k, v in headers.items()}, "last-event-id": "café-1".encode()}
    response = await http.get(session.url, headers=raw)
    assert response.status_code == 404
    evidence = response.json()["error"]["data"]["evidence"]
    assert evidence["cursor"] == "café-1"


async def test_shutdown_is_bounded_with_the_store_gone(
    mcp_redis: ServerHandle, tmp_path: Path
) -> None:
    """Hundreds of sessions, live GET streams, the store silent: SIGTERM still ends the process."""
    with TcpProxy([("127.0.0.1", mcp_redis.ports[0])]) as proxy:
        server = spawn_replica("shutdown", f"{proxy.url()}?prefix=fs:", tmp_path)
        try:
            wait_ready([server])
            async with httpx.AsyncClient(
                timeout=httpx.Timeout(20.0), limits=httpx.Limits(max_connections=None)
            ) as http:
                sessions = []
                for _ in range(20):
                    batch = [RawSession(http, server.url).initialize() for _ in range(10)]
                    async with anyio.create_task_group() as tg:
                        for pending in batch:
                            tg.start_soon(_collect, pending, sessions)
                async with anyio.create_task_group() as tg:
                    for session in sessions[:20]:
                        tg.start_soon(_hold_get, session)
                    await anyio.sleep(1.0)
                    proxy.pause()
                    server.proc.send_signal(signal.SIGTERM)
                    with anyio.fail_after(30):  # a hang guard, not a timing assertion
                        await anyio.to_thread.run_sync(server.proc.wait)
                    tg.cancel_scope.cancel()
            assert len(sessions) == 200
            assert server.proc.returncode is not None
        finally:
            proxy.resume()
            server.stop()


async def _collect(pending: object, into: list[RawSession]) -> None:
    into.append(await pending)  # type: ignore[misc]


async def _hold_get(session: RawSession) -> None:
    try:
        async with session.get() as response:
            async for _ in sse_events(response):
                pass
    except httpx.HTTPError:
        pass

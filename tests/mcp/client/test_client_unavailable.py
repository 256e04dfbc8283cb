"""A call made while the server's store is out of reach returns once the store is back, run once.

Against a real server (the example server's tools and a ``bump`` tool that
records each run, served by uvicorn on a loopback port) whose Redis is
reached through a TCP proxy: pausing the proxy is a store that stops
answering, so the server answers requests 503 with ``Retry-After: 1``. The
client is the shipped :class:`ResumingSession`, which sends a request
answered so again (:class:`RetryUnavailable`), unless told not to.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import pytest
from fastmcp import Client as FastMCPClient
from fastmcp.client.transports import StreamableHttpTransport

from replaystore import ReplayBuffer
from replaystore.mcp import streamable_http_app
from replaystore.mcp.client import DesyncWatch, ResumingSession, RetryBudget, RetryUnavailable
from replaystore.mcp.example import build_server
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import served_in_loop

pytestmark = pytest.mark.anyio

#: What the client logs for each request it sends again.
RETRIED = "answered 503: sent again"


@dataclass
class Served:
    url: str
    proxy: TcpProxy
    redis: tuple[str, int]
    ran: list[str] = field(default_factory=list)

    def down(self) -> None:
        """The store goes down: its connections are cut, new ones refused."""
        self.proxy.set_upstreams([])
        self.proxy.sever_all()

    def back(self) -> None:
        self.proxy.set_upstreams([self.redis])
        self.proxy.resume()


@pytest.fixture(scope="module")
def store_proxy(mcp_redis: ServerHandle) -> Iterator[TcpProxy]:
    with TcpProxy([("127.0.0.1", mcp_redis.ports[0])]) as proxy:
        yield proxy


@pytest.fixture
async def served(store_proxy: TcpProxy, mcp_redis: ServerHandle) -> AsyncIterator[Served]:
    """The example server's tools and ``bump``, its store behind the proxy."""
    served = Served("", store_proxy, ("127.0.0.1", mcp_redis.ports[0]))
    served.back()
    server = build_server()

    @server.tool()
    async def bump(tag: str) -> str:
        """Record one run (the side effect a test counts)."""
        served.ran.append(tag)
        return f"bumped {tag}"

    buffer = ReplayBuffer.from_url(f"{store_proxy.url()}?prefix=unavailable:")
    # A long lease: a tool whose appends wait for the store rides a paused proxy.
    app = streamable_http_app(server, buffer, retry_interval=300, lease_ttl=30.0, close_buffer=True)
    async with served_in_loop(app) as port:
        served.url = f"http://127.0.0.1:{port}/mcp"
        try:
            yield served
        finally:
            served.back()


def _text(result: Any) -> str:
    return str(result.content[0].text)


async def _until(check: Callable[[], bool], seconds: float = 15.0) -> None:
    with anyio.fail_after(seconds):
        while not check():  # noqa: ASYNC110 - polled: the condition is another component's
            await anyio.sleep(0.05)


async def _collect(result: Awaitable[Any], into: list[Any]) -> None:
    try:
        into.append(await result)
    except Exception as exc:
        into.append(exc)


def _retries(caplog: pytest.LogCaptureFixture, method: str) -> int:
    return sum(
        1 for r in caplog.records if RETRIED in r.getMessage() and r.getMessage().startswith(method)
    )


async def test_a_call_made_while_the_store_is_down_returns_once_it_is_back_run_once(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="replaystore.mcp.client")
    with anyio.fail_after(60):
        async with ResumingSession(served.url) as mcp:
            outcome: list[Any] = []
            served.down()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_collect, mcp.call_tool("bump", {"tag": "a"}), outcome)
                    await _until(lambda: _retries(caplog, "POST") >= 2)  # two 503s at least
                    assert outcome == [] and served.ran == []  # refused: nothing ran
                    served.back()
            finally:
                served.back()
            assert _text(outcome[0]) == "bumped a"
            assert served.ran == ["a"]  # once
            session = mcp.session_id
            assert _text(await mcp.call_tool("bump", {"tag": "b"})) == "bumped b"
            assert served.ran == ["a", "b"] and mcp.session_id == session  # the same session


async def test_a_fastmcp_client_built_by_the_watch_rides_the_outage_too(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="replaystore.mcp.client")
    watch = DesyncWatch()
    transport = StreamableHttpTransport(served.url, httpx_client_factory=watch.client_factory)
    with anyio.fail_after(60):
        async with FastMCPClient(transport, mode="legacy") as client:
            outcome: list[Any] = []
            served.down()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_collect, client.call_tool("bump", {"tag": "f"}), outcome)
                    await _until(lambda: _retries(caplog, "POST") >= 2)
                    assert outcome == [] and served.ran == []
                    served.back()
            finally:
                served.back()
            assert _text(outcome[0]) == "bumped f", repr(outcome[0])
            assert served.ran == ["f"]


async def test_without_the_retry_the_call_fails_as_in_the_sdk_and_the_session_goes_on(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="replaystore.mcp.client")
    with anyio.fail_after(60):
        async with ResumingSession(served.url, retry=None) as mcp:
            session = mcp.session_id
            served.down()
            try:
                with pytest.raises(Exception) as failed:
                    await mcp.call_tool("bump", {"tag": "a"})
            finally:
                served.back()
            assert "503" in str(failed.value) or "Service Unavailable" in str(failed.value), repr(
                failed.value
            )
            assert served.ran == [] and _retries(caplog, "POST") == 0
            assert _text(await mcp.call_tool("bump", {"tag": "b"})) == "bumped b"
            assert served.ran == ["b"] and mcp.session_id == session


async def test_a_call_made_while_the_store_stalls_never_runs_twice(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """A stalled store takes the request's lease late: the copy sent again runs it, once.

    The server answers 503 while the store does not answer; the lease writes
    it sent meanwhile reach the store when it wakes, naming this replica on a
    request it refused and never ran. The copy sent again takes that lease
    over and runs the request: its result, not ``request lost``, and one run.
    """
    caplog.set_level(logging.INFO, logger="replaystore.mcp.client")
    with anyio.fail_after(90):
        async with ResumingSession(served.url, retry=RetryBudget(within=80.0)) as mcp:
            outcome: list[Any] = []
            served.proxy.pause()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_collect, mcp.call_tool("bump", {"tag": "a"}), outcome)
                    await _until(lambda: _retries(caplog, "POST") >= 2)
                    assert outcome == [] and served.ran == []
                    served.back()
            finally:
                served.back()
            (answer,) = outcome
            assert served.ran == ["a"] and _text(answer) == "bumped a", repr(answer)
            assert _text(await mcp.call_tool("bump", {"tag": "b"})) == "bumped b"
            assert served.ran == ["a", "b"]


async def test_a_resumption_answered_503_gets_each_event_once(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """The server cuts the call's stream after 3 progress; the store goes down right then.

    The client's GET resuming the stream is answered 503 until the store is
    back, is sent again, and the call ends with every progress once.
    """
    caplog.set_level(logging.INFO, logger="replaystore.mcp.client")
    progress: list[float] = []

    async def count(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)
        if value == 3:
            served.down()  # before the client resumes (300 ms later)

    def resumed_through_503() -> bool:
        return any("resuming after" in r.getMessage() for r in caplog.records)

    arguments = {"n": 8, "interval_ms": 400, "close_after": 3}
    with anyio.fail_after(60):
        async with ResumingSession(served.url) as mcp:
            outcome: list[Any] = []
            try:
                async with anyio.create_task_group() as tg:
                    call = mcp.call_tool("countdown", arguments, progress_callback=count)
                    tg.start_soon(_collect, call, outcome)
                    await _until(resumed_through_503)
                    assert outcome == []
                    served.back()
            finally:
                served.back()
            assert _text(outcome[0]) == "done 8", repr(outcome[0])
            assert progress == [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.fixture
async def answering() -> AsyncIterator[tuple[str, list[str]]]:
    """A real HTTP server that answers ``/<status>/<retry-after>/<times>`` that often, then 200.

    ``-`` for no ``Retry-After``. Returns its base URL and the paths it was asked.
    """
    asked: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        path = scope["path"]
        asked.append(path)
        _, status, wait, times = path.split("/")
        refuse = asked.count(path) <= int(times)
        headers = [(b"content-type", b"application/json")]
        if refuse and wait != "-":
            headers.append((b"retry-after", wait.encode()))
        code = int(status) if refuse else 200
        await send({"type": "http.response.start", "status": code, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    async with served_in_loop(app) as port:
        yield f"http://127.0.0.1:{port}", asked


async def _post(url: str, budget: RetryBudget, **request: Any) -> tuple[int, float]:
    """The status a POST through :class:`RetryUnavailable` ends with, and how long it took."""
    started = anyio.current_time()
    transport = RetryUnavailable(budget=budget)
    async with httpx2.AsyncClient(transport=transport, timeout=10.0) as http:
        response = await http.post(url, **request)
    return response.status_code, anyio.current_time() - started


async def test_what_is_sent_again_and_what_is_passed_on(
    answering: tuple[str, list[str]],
) -> None:
    base, asked = answering
    budget = RetryBudget(tries=3, within=5.0, longest_wait=0.2, jitter=0.0)
    with anyio.fail_after(30):
        # Sent again after the wait asked for, until answered.
        assert (await _post(f"{base}/503/0/2", budget, json={}))[0] == 200
        assert asked.count("/503/0/2") == 3
        # A Retry-After above the longest wait is waited that long only.
        status, took = await _post(f"{base}/503/60/1", budget, json={})
        assert status == 200 and asked.count("/503/60/1") == 2 and took < 5
        # At most `tries` sends: the last 503 is passed on.
        assert (await _post(f"{base}/503/0/9", budget, json={}))[0] == 503
        assert asked.count("/503/0/9") == 3
        # A wait that would end past `within` is not begun.
        late = RetryBudget(tries=3, within=0.5, longest_wait=2.0, jitter=0.0)
        assert (await _post(f"{base}/503/1/1", late, json={}))[0] == 503
        assert asked.count("/503/1/1") == 1
        # Nothing says these were not taken: passed on at once.
        assert (await _post(f"{base}/503/-/1", budget, json={}))[0] == 503
        assert (await _post(f"{base}/502/0/1", budget, json={}))[0] == 502
        assert asked.count("/503/-/1") == asked.count("/502/0/1") == 1

        # A streamed body cannot be sent again.
        async def body() -> AsyncIterator[bytes]:
            yield b"{}"

        assert (await _post(f"{base}/503/0/1", budget, content=body()))[0] == 503
        assert asked.count("/503/0/1") == 1

"""A bug inside the Redis backend is a 500 with its traceback logged; a store outage is a 503.

The example app runs in this process (uvicorn on a loopback port, so the
log records reach ``caplog``) on the real Redis, through a TCP proxy that can
point it at a port where nothing listens. A patched backend method raising
``AttributeError`` (what a renamed redis-py attribute, or a plain bug, raises)
must not be told to clients or operators as the store being unreachable: no
``503``, no ``Retry-After``, and the traceback in the log. The same request
while the store is really out of reach is the ``503`` with ``Retry-After``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

from replaystore.backends.redis import RedisBackend
from replaystore.backends.redis.marker import StoreMarker
from replaystore.mcp.example import build_app
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import find_free_port
from replaystore.testing.sse import sse_events
from tests.mcp._support import RawSession, served_in_loop

pytestmark = pytest.mark.anyio

REDIS = ("127.0.0.1", 6379)
BUG = "'Redis' object has no attribute 'moved_in_a_release'"


@asynccontextmanager
async def _served(store_url: str) -> AsyncIterator[str]:
    """The example app on ``store_url``, served over HTTP in this process; its MCP URL."""
    app = build_app(store_url, drain_seconds=0.1)
    # log_config=None: uvicorn leaves logging alone, so its records reach caplog.
    async with served_in_loop(app, log_config=None, lifespan="on") as port:
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
def proxy() -> AsyncIterator[TcpProxy]:
    with TcpProxy([REDIS]) as running:
        yield running


@pytest.fixture
async def url(proxy: TcpProxy) -> AsyncIterator[str]:
    prefix = f"bug{uuid.uuid4().hex[:8]}:"
    async with _served(f"{proxy.url()}?prefix={prefix}") as served:
        yield served


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0)) as client:
        yield client


async def _primed(session: RawSession) -> str:
    """Run a tool to its end; the id of its stream's priming event (where a resume starts)."""
    request_id, body = session.call("countdown", {"n": 2, "interval_ms": 0})
    priming = ""
    async with session.post(body) as response:
        assert response.status_code == 200
        async for event in sse_events(response):
            if event.priming and event.id:
                priming = event.id
            if event.message and event.message.get("id") == request_id:
                break
    assert priming
    return priming


def _raise_bug(*args: Any, **kwargs: Any) -> Any:
    raise AttributeError(BUG)


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.exc_info and isinstance(r.exc_info[1], AttributeError) and BUG in str(r.exc_info[1])
    ]


async def test_a_bug_in_a_resume_is_a_500_with_its_traceback_not_a_503(
    url: str, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    session = await RawSession(http, url).initialize()
    priming = await _primed(session)
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(RedisBackend, "resolve", _raise_bug)
    with anyio.fail_after(15):
        async with session.get(priming) as response:
            await response.aread()
    assert response.status_code == 500, (response.status_code, response.text)
    assert "retry-after" not in response.headers
    assert "storage_error" not in response.text and "unreachable" not in response.text
    assert _tracebacks(caplog), [r.getMessage() for r in caplog.records]


async def test_a_bug_under_a_coordination_call_is_a_500_with_its_traceback(
    url: str, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    """A request on a session this replica does not serve reads the session registry first,
    with the store's marker in the same packet: a bug taking that marker in is no outage."""
    session = await RawSession(http, url).initialize()
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(StoreMarker, "due", lambda self: True)
    monkeypatch.setattr(StoreMarker, "seen", _raise_bug)
    other = RawSession(http, url, session_id=session.session_id + "-elsewhere")
    with anyio.fail_after(15):
        response = await http.post(url, json=other.request("ping", {})[1], headers=other.headers())
    assert response.status_code == 500, (response.status_code, response.text)
    assert "retry-after" not in response.headers
    assert _tracebacks(caplog), [r.getMessage() for r in caplog.records]


async def test_a_store_out_of_reach_is_still_a_503_with_retry_after(
    url: str, http: httpx.AsyncClient, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    session = await RawSession(http, url).initialize()
    priming = await _primed(session)
    proxy.set_upstreams([("127.0.0.1", find_free_port())])  # nothing listens there
    proxy.sever_all()
    with anyio.fail_after(15):
        async with session.get(priming) as response:
            await response.aread()
    assert response.status_code == 503, (response.status_code, response.text)
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["data"]["reason"] == "storage_error"
    assert not [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR]

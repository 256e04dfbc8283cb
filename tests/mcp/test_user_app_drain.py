"""The app a user builds drains on a rolling restart, with no code of its own for it.

Two replicas of a user-style app (``tests/mcp/user_sdk_app.py``, an
``MCPServer``; ``tests/mcp/user_fastmcp_app.py``, a FastMCP app: the docs'
snippets plus one 8 s tool), each started by plain ``uvicorn module:app``
as an operator would, behind ``deploy/nginx.conf`` (started as
``test_balancers`` starts it), on one Redis. ``SIGTERM`` to the replica
running the call: the shipped client gets its result and every progress
notification once. Without the wiring's drain, uvicorn and sse-starlette
end the call's stream at the signal and the app's shutdown stops the tool:
the client is told its request was lost.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
import redis
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from replaystore import ReplayBuffer
from replaystore.mcp import streamable_http_app
from replaystore.mcp.client import ResumingSession
from replaystore.testing.servers import ServerHandle, find_free_port
from replaystore.testing.sse import sse_events
from tests.mcp._balancers import ROOT, Replica, _ensure_balancers, _start_balancers
from tests.mcp._support import START_TIMEOUT, RawSession, progress_of, result_text

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

#: The call the replica is stopped under: 16 progress notifications, 0.5 s apart (8 s).
STEPS, INTERVAL = 16, 0.5

APPS = {"sdk": "tests.mcp.user_sdk_app:app", "fastmcp": "tests.mcp.user_fastmcp_app:app"}


@dataclass
class UvicornReplica(Replica):
    """A replica of a user's app, run as ``uvicorn module:app`` with uvicorn's defaults."""

    app: str = ""

    def start(self) -> None:
        self.starts += 1
        log = self.logs / f"replica-{self.port}-{self.starts}.log"
        args = [sys.executable, "-m", "uvicorn", self.app, "--host", "127.0.0.1",
                "--port", str(self.port)]  # fmt: skip
        env = {**os.environ, "REPLAYSTORE_URL": self.store}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip


@dataclass
class Pair:
    replicas: list[UvicornReplica]
    url: str
    prefix: str


@pytest.fixture(scope="module", params=sorted(APPS))
def pair(request: pytest.FixtureRequest, mcp_redis: ServerHandle) -> Iterator[Pair]:
    """Two replicas of one user app behind nginx (HAProxy idles beside it), on one Redis."""
    _ensure_balancers()
    work = Path(tempfile.mkdtemp(prefix="replaystore-user-drain-"))
    prefix = f"userdrain-{request.param}:"
    store = f"{mcp_redis.url}?prefix={prefix}"
    replicas = [
        UvicornReplica(find_free_port(), store, work, app=APPS[request.param]) for _ in range(2)
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for replica in replicas:
            replica.start()
        # deploy/nginx.conf names three replicas: the second stands in for the third.
        ports = [replicas[0].port, replicas[1].port, replicas[1].port]
        nginx_port, _, _ = _start_balancers(work, ports, procs)
        for replica in replicas:
            replica.wait_healthy(START_TIMEOUT)  # FastMCP's import is slow on a busy machine
        yield Pair(replicas, f"http://127.0.0.1:{nginx_port}/mcp", prefix)
    finally:
        for proc in procs:
            proc.terminate()
        for replica in replicas:
            replica.stop(signal.SIGKILL, timeout=5)
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(work, ignore_errors=True)


def _running_on(pair: Pair, redis_url: str) -> UvicornReplica:
    """The replica holding the one request lease in the store (its id is in its health check)."""
    client = redis.Redis.from_url(redis_url)
    try:
        owners = {
            value.decode()
            for key in client.scan_iter(match=f"{pair.prefix}*mcp:lease:*")
            if (value := client.get(key)) not in (None, b"-")
        }
    finally:
        client.close()
    assert len(owners) == 1, owners
    owner = owners.pop()
    found = [r for r in pair.replicas if owner in r.wait_healthy()]
    assert len(found) == 1, (owner, found)
    return found[0]


async def test_sigterm_to_the_replica_running_a_call_loses_nothing(
    pair: Pair, mcp_redis: ServerHandle
) -> None:
    progress: list[float] = []
    two = anyio.Event()
    results: list[str] = []
    answered: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)
        if len(progress) == 2:
            two.set()

    async with ResumingSession(pair.url) as client:

        async def call() -> None:
            result = await client.call_tool(
                "countdown", {"n": STEPS, "interval": INTERVAL}, progress_callback=on_progress
            )
            results.append(result.content[0].text)
            answered.append(time.monotonic())

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(20):
                await two.wait()
            victim = await anyio.to_thread.run_sync(_running_on, pair, mcp_redis.url)
            signalled = time.monotonic()
            stopped = signalled + await anyio.to_thread.run_sync(victim.stop)
        # The session goes on, on the replica left.
        with anyio.fail_after(15):
            after = await client.call_tool("countdown", {"n": 1, "interval": 0})
    assert results == [f"done {STEPS}"], victim.log_tail()
    assert progress == [float(i) for i in range(1, STEPS + 1)]
    assert after.content[0].text == "done 1"
    # The replica stopped once its call was done, well within its drain (10 s by default).
    assert stopped - answered[0] < 3, (stopped - signalled, victim.log_tail())
    assert victim.proc is not None and victim.proc.returncode is not None


async def test_what_outlasts_the_drain_is_cut_when_it_runs_out() -> None:
    """uvicorn told to stop (in this process, as its signal handler does), a 1 s drain.

    The running call's stream stays open for the drain, then ends (its
    client would resume it elsewhere), and uvicorn finishes stopping, with
    no timeout of its own: nothing holds the shutdown past the drain.
    """
    server_app = MCPServer("demo")

    @server_app.tool()
    async def countdown(ctx: Context, n: int) -> str:
        for i in range(n):
            await anyio.sleep(0.1)
            await ctx.report_progress(i + 1, n)
        return f"done {n}"

    app = streamable_http_app(server_app, ReplayBuffer.from_url("memory://"), drain_seconds=1)
    port = find_free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    async with anyio.create_task_group() as tg:
        stopped = anyio.Event()

        async def serve() -> None:
            await server.serve()
            stopped.set()

        tg.start_soon(serve)
        with anyio.fail_after(20):
            while not server.started:  # noqa: ASYNC110 - uvicorn offers no event
                await anyio.sleep(0.02)
        async with httpx.AsyncClient(timeout=30) as http:
            session = await RawSession(http, f"http://127.0.0.1:{port}/mcp").initialize()
            request_id, body = session.call("countdown", {"n": 300}, token="t")
            async with session.post(body) as running:
                events = sse_events(running)
                async for event in events:
                    if progress_of(event) is not None:
                        break
                told = time.monotonic()
                server.should_exit = True
                with anyio.fail_after(10):
                    async for event in events:
                        assert result_text(event, request_id) is None
                ended = time.monotonic() - told
        with anyio.fail_after(10):
            await stopped.wait()
        down = time.monotonic() - told
    assert 1.0 <= ended < 3.0, ended
    assert down < 4.0, down

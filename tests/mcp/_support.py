"""Real MCP server processes and a raw HTTP/SSE client for the MCP integration tests.

The servers run as subprocesses (``replaystore example-server``, as the docs
and ``docker-compose.yml`` start it, or the FastMCP twin in
``tests/mcp/fastmcp_app.py``) on free loopback ports, so the
tests see real sockets, real disconnects and real Redis round trips. The raw
client (:mod:`replaystore.testing.mcp`) speaks the legacy streamable HTTP
protocol (2025-11-25) by hand, which is the only way to drop a connection at
an exact point and to read the HTTP status and body of a failed resumption.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import uvicorn

from replaystore.cursor import Cursor
from replaystore.testing import mcp
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import find_free_port
from replaystore.testing.sse import SSE
from replaystore.testing.sse import sse_events as sse_events

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0
#: The protocol version the raw session speaks.
PV = mcp.PROTOCOL


@dataclass
class ServerProcess:
    """One MCP server subprocess; ``url`` is its MCP endpoint."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    store_url: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class ProxiedReplicas:
    """Replicas of one store and a round-robin proxy in front of them."""

    name: str
    replicas: list[ServerProcess]
    proxy: TcpProxy

    @property
    def url(self) -> str:
        return f"http://{self.proxy.host}:{self.proxy.port}/mcp"


def _popen(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Wide log lines: one record per line (rich wraps at 80 columns otherwise).
            env={**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "400"},
        )


#: The example server's command line (after ``python``), exactly as a user runs it.
EXAMPLE_SERVER = ("-m", "replaystore", "example-server")


def spawn(
    name: str, command: Sequence[str], store_url: str, max_events: int, log_dir: Path
) -> ServerProcess:
    """One server process: ``python COMMAND... --port --url --max-events``."""
    port = find_free_port()
    log_path = log_dir / f"{name}.log"
    args = [*command, "--port", str(port), "--url", store_url,
            "--max-events", str(max_events), "--log-level", "warning"]  # fmt: skip
    return ServerProcess(name, port, _popen(args, log_path), log_path, store_url)


def spawn_many(
    name: str, apps: dict[str, tuple[str, str, int]], log_dir: Path
) -> dict[str, ServerProcess]:
    """Several apps (``name -> (kind, store_url, max_events)``) in one process, one port each."""
    specs = [
        [app, kind, find_free_port(), url, max_events]
        for app, (kind, url, max_events) in apps.items()
    ]
    log_path = log_dir / f"{name}.log"
    proc = _popen(["-m", "tests.mcp.multi_server", json.dumps(specs)], log_path)
    return {
        str(app): ServerProcess(str(app), int(port), proc, log_path, str(url))
        for app, _kind, port, url, _max in specs
    }


def wait_ready(servers: list[ServerProcess]) -> None:
    """Wait until every server accepts connections and answers HTTP.

    Polls with bare sockets: building an httpx client per attempt costs enough
    CPU (TLS context) to slow the servers' start-up on a two-core machine.
    """
    deadline = time.monotonic() + START_TIMEOUT
    pending = list(servers)
    while pending:
        for server in list(pending):
            if server.proc.poll() is not None:
                raise RuntimeError(f"{server.name} exited early:\n{server.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=0.5).close()
            except OSError:
                continue
            pending.remove(server)
        if pending:
            if time.monotonic() > deadline:
                names = ", ".join(s.name for s in pending)
                raise RuntimeError(f"servers not ready: {names}\n{pending[0].log_tail()}")
            time.sleep(0.1)
    with httpx.Client(timeout=5) as client:
        for server in servers:
            assert client.get(server.url).status_code == 400  # no session id: 400, not down


# ---------------------------------------------------------------------- SSE


def progress_of(event: SSE) -> float | None:
    message = event.message
    if message and message.get("method") == "notifications/progress":
        return float(message["params"]["progress"])
    return None


def result_text(event: SSE, request_id: int) -> str | None:
    message = event.message
    if message and message.get("id") == request_id and "result" in message:
        return str(message["result"]["content"][0]["text"])
    return None


def position(event_id: str) -> int:
    return Cursor.parse(event_id).position


# ---------------------------------------------------------------- raw client


class RawSession(mcp.RawSession):
    """The shipped raw session, with a tool call read to its result's text."""

    async def run_tool(self, tool: str, arguments: dict[str, Any], token: str | None = None) -> str:
        """Call a tool on a fresh POST stream and read it to the result."""
        with anyio.fail_after(15):
            events = await self.run(tool, arguments, token)
        message = events[-1].message if events else None
        if message is None or "result" not in message:
            raise AssertionError(f"no result: {events!r}")
        return str(message["result"]["content"][0]["text"])


def metric(text: str, name: str, **labels: str) -> float:
    """Read one sample from a Prometheus text exposition (0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, label_text = head.partition("{")
        if sample != name:
            continue
        got = ",".join(sorted(label_text.rstrip("}").split(","))) if label_text else ""
        if got == want:
            return float(value)
    return 0.0


@contextlib.contextmanager
def stopped_on_exit(servers: list[ServerProcess]) -> Iterator[None]:
    try:
        yield
    finally:
        for server in servers:
            server.stop()


def spawn_replica(name: str, store_url: str, log_dir: Path, *extra: str) -> ServerProcess:
    """One ``replaystore example-server`` replica (extra command-line options allowed)."""
    port = find_free_port()
    log_path = log_dir / f"{name}.log"
    args = [*EXAMPLE_SERVER, "--port", str(port), "--url", store_url,
            "--log-level", "warning", *extra]  # fmt: skip
    return ServerProcess(name, port, _popen(args, log_path), log_path, store_url)


@contextlib.contextmanager
def replica_pair(store_url: str, log_dir: Path) -> Iterator[list[ServerProcess]]:
    """Replicas ``a`` and ``b`` on one store, logging at info, ready, always stopped."""
    started = [spawn_replica(name, store_url, log_dir, "--log-level", "info") for name in "ab"]
    try:
        wait_ready(started)
        yield started
    finally:
        for server in started:
            server.stop()


def no_keepalive_client() -> httpx2.AsyncClient:
    """An HTTP client for the SDK's MCP client that opens a new connection per request.

    A round-robin proxy then routes every request (and every reconnect) anew.
    """
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(30.0, read=300.0),
        limits=httpx2.Limits(max_keepalive_connections=0),
    )


@contextlib.asynccontextmanager
async def served_in_loop(app: Any, **config: Any) -> AsyncIterator[int]:
    """``app`` served by uvicorn in this event loop on a free loopback port (yielded).

    In this loop, a test can reach into the app (drain its manager, pause it
    at a seam, read its log records); ``config`` goes to ``uvicorn.Config``
    (``log_level="error"`` unless given).
    """
    port = find_free_port()
    config.setdefault("log_level", "error")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **config))
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        with anyio.fail_after(30):
            while not server.started:  # noqa: ASYNC110 - uvicorn offers no event
                await anyio.sleep(0.02)
        try:
            yield port
        finally:
            server.should_exit = True

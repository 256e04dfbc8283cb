"""The deployment of ``docs/deployment.md``, run: real nginx and HAProxy, three replicas, one Redis.

The balancers run the very configuration files the deployment guide shows
(``deploy/nginx.conf``, ``deploy/haproxy.cfg``; a test checks the guide quotes
them verbatim); only the addresses are rewritten to free loopback ports. Each
replica is ``replaystore example-server``, as an operator starts it. nginx and
HAProxy are installed with apt when missing (CI starts from a bare machine);
every process started here is stopped, whatever happens.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from replaystore import ReplayBuffer
from replaystore.mcp.client.tasks import TaskClient
from replaystore.mcp.settings import DEFAULT_STORE_TIMEOUT
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle, find_free_port, redis_server_binary
from replaystore.testing.servers import start_standalone as start_redis
from replaystore.testing.sse import SSE, sse_events
from tests.mcp._balancers import (
    DEPLOY,
    DRAIN,
    LEASE,
    ROOT,
    Replica,
    _ensure_balancers,
    _start_balancers,
)
from tests.mcp._support import RawSession, progress_of, result_text

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

PV = "2025-11-25"

#: nginx's ``fail_timeout`` in deploy/nginx.conf: how long it leaves out a replica that refused.
NGINX_FAIL_TIMEOUT = 1.0
#: One call of the steady traffic: progress every 100 ms, 0.8 s in all.
CALL = {"n": 8, "interval_ms": 100}


# ---------------------------------------------------------------- processes


@dataclass
class Deployment:
    redis: ServerHandle
    replicas: list[Replica]
    nginx_url: str
    haproxy_url: str
    haproxy_socket: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def haproxy_servers(self) -> dict[str, str]:
        """HAProxy's view of the replicas: server name -> UP, DOWN, ... (its health check)."""
        return _haproxy_servers(self.haproxy_socket)

    def wait_haproxy(self, want: str, names: list[str], timeout: float = 15.0) -> None:
        _wait_haproxy(self.haproxy_socket, want, names, timeout)

    def replica_of(self, replica_id: str) -> Replica:
        for replica in self.replicas:
            if replica_id in replica.wait_healthy():
                return replica
        raise AssertionError(f"no replica says it is {replica_id}")


def _haproxy_servers(socket_path: Path) -> dict[str, str]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(2)
        sock.connect(str(socket_path))
        sock.sendall(b"show stat\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
    return {r["svname"]: r["status"] for r in rows if r["pxname"] == "replicas"}


def _wait_haproxy(socket_path: Path, want: str, names: list[str], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        seen = _haproxy_servers(socket_path)
        if all(seen.get(n, "").startswith(want) for n in names):
            return
        assert time.monotonic() < deadline, f"HAProxy sees {seen}, not {want} for {names}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    _ensure_balancers()
    work = Path(tempfile.mkdtemp(prefix="replaystore-balancers-"))
    store = start_redis(redis_server_binary(), "redis")
    replicas = [Replica(find_free_port(), store.url, work) for _ in range(3)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for replica in replicas:
            replica.start()
        ports = [r.port for r in replicas]

        nginx_port, haproxy_port, socket_path = _start_balancers(work, ports, procs)
        for replica in replicas:
            replica.wait_healthy()
        # HAProxy's first checks may have run before the replicas listened: a
        # test that starts before it sees them UP gets its 503 (seen on a
        # loaded machine).
        _wait_haproxy(socket_path, "UP", [f"replica{i}" for i in range(1, len(replicas) + 1)])
        yield Deployment(
            store,
            replicas,
            f"http://127.0.0.1:{nginx_port}/mcp",
            f"http://127.0.0.1:{haproxy_port}/mcp",
            socket_path,
            procs,
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for replica in replicas:
            replica.stop(signal.SIGKILL, timeout=5)
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        store.stop()
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- clients


@dataclass
class Traffic:
    """Steady calls from a few SDK clients through one balancer."""

    url: str
    done: list[list[float]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    async def client(self, stop: anyio.Event) -> None:
        async with (
            streamable_http_client(self.url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            while not stop.is_set():
                progress: list[float] = []

                async def on_progress(value: float, total: float | None, msg: str | None) -> None:
                    progress.append(value)  # noqa: B023 - read before the next call

                try:
                    with anyio.fail_after(30):
                        result = await session.call_tool(
                            "countdown", CALL, progress_callback=on_progress
                        )
                    text = result.content[0].text  # type: ignore[union-attr]
                    if text != f"done {CALL['n']}":
                        self.failed.append(f"result {text!r}")
                except Exception as exc:
                    self.failed.append(repr(exc)[:300])
                self.done.append(progress)


def _initialize_body() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": PV,
            "capabilities": {},
            "clientInfo": {"name": "balancer-test", "version": "1"},
        },
    }


_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


# ---------------------------------------------------------------- tests


def test_guide_shows_the_tested_configurations() -> None:
    """docs/deployment.md quotes deploy/nginx.conf and deploy/haproxy.cfg verbatim."""
    guide = (ROOT / "docs" / "deployment.md").read_text()
    for name in ("nginx.conf", "haproxy.cfg"):
        text = (DEPLOY / name).read_text()
        assert f"`deploy/{name}`" in guide
        assert text.strip() in guide, f"docs/deployment.md does not quote deploy/{name} as it is"


def test_compose_file_runs_the_tested_deployment() -> None:
    """docker-compose.yml: Redis, replica1..3 on port 8000 checked at /healthz, both balancers."""
    import yaml  # PyYAML comes with FastMCP, part of the dev extra

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name in ("replica1", "replica2", "replica3"):
        replica = services[name]
        command = replica["command"]
        assert command[:2] == ["replaystore", "example-server"]
        assert command[command.index("--port") + 1] == "8000"
        url = command[command.index("--url") + 1]
        assert url.startswith("redis://replaystore:${REDIS_PASSWORD") and "@redis:6379/" in url
        assert "/healthz" in " ".join(replica["healthcheck"]["test"])
        # Long enough for the drain: the container is not killed mid-call.
        assert int(replica["stop_grace_period"].rstrip("s")) > 10
    assert "./deploy/nginx.conf:/etc/nginx/conf.d/default.conf:ro" in services["nginx"]["volumes"]
    assert (
        "./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"
        in services["haproxy"]["volumes"]
    )
    for balancer in ("nginx", "haproxy"):
        assert set(services[balancer]["depends_on"]) == {"replica1", "replica2", "replica3"}
    # Redis as docs/deployment.md asks: no host port, maxmemory without eviction, and the
    # replicas' user with exactly the guide's ACL (the default user off).
    redis_service = services["redis"]
    assert "ports" not in redis_service
    line = " ".join(redis_service["command"])
    assert "--maxmemory 256mb --maxmemory-policy noeviction" in line
    assert "--user default off " in line
    guide = (ROOT / "docs" / "deployment.md").read_text()
    (rules,) = re.findall(r"^ACL SETUSER replaystore (.+)$", guide, re.MULTILINE)
    rules = rules.replace(">PASSWORD", ">${REDIS_PASSWORD:?set REDIS_PASSWORD}")
    assert f"--user replaystore {rules}" in line, line


def test_documented_health_check_sees_every_replica_healthy(deployment: Deployment) -> None:
    for replica in deployment.replicas:
        answer = httpx.get(f"{replica.base}/healthz", timeout=5)
        assert answer.status_code == 200 and answer.text.startswith("ok"), answer.text
        # Bare, as a balancer sends it: no Host of ours, no Accept.
        with socket.create_connection(("127.0.0.1", replica.port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 200")
    deployment.wait_haproxy("UP", ["replica1", "replica2", "replica3"])
    nginx = deployment.nginx_url.removesuffix("/mcp")
    assert {httpx.get(f"{nginx}/healthz", timeout=5).status_code for _ in range(6)} == {200}
    # And MCP itself through both, Host passed through as documented.
    for url in (deployment.nginx_url, deployment.haproxy_url):
        answer = httpx.post(url, json=_initialize_body(), headers=_HEADERS, timeout=10)
        assert answer.status_code == 200, answer.text


async def test_rolling_restart_fails_no_call_and_duplicates_no_progress(
    deployment: Deployment,
) -> None:
    """The replicas restarted one at a time under steady traffic through both balancers."""
    traffic = {"nginx": Traffic(deployment.nginx_url), "haproxy": Traffic(deployment.haproxy_url)}
    stop = anyio.Event()
    drains: list[float] = []
    async with anyio.create_task_group() as tg:
        for through in traffic.values():
            for _ in range(3):
                tg.start_soon(through.client, stop)
        await anyio.sleep(1.5)
        for i, replica in enumerate(deployment.replicas, 1):
            drains.append(await anyio.to_thread.run_sync(replica.stop))
            replica.start()
            await anyio.to_thread.run_sync(replica.wait_healthy)
            healthy = time.monotonic()
            # A rolling restart moves on once the balancers take the replica back:
            # HAProxy's check sees it UP; nginx tries it again after fail_timeout,
            # and takes it back only by sending it traffic (with 0.5 s here, 6 of
            # 8 runs had nginx answer 502 for a second, no upstream it believed
            # live, when the next replica stopped; with 2 s, 4 of 4 passed).
            await anyio.to_thread.run_sync(deployment.wait_haproxy, "UP", [f"replica{i}"])
            await anyio.sleep(max(0.0, healthy + NGINX_FAIL_TIMEOUT - time.monotonic()))
            await anyio.sleep(2.0)
        await anyio.sleep(1.0)
        stop.set()
    expected = [float(i) for i in range(1, CALL["n"] + 1)]
    for balancer, through in traffic.items():
        assert through.failed == [], (balancer, through.failed)
        assert len(through.done) >= 9, f"the traffic through {balancer} was not steady"
        assert [p for p in through.done if p != expected] == [], balancer
    # Each replica stopped once its calls were done, well before the drain ran out.
    assert all(seconds < DRAIN for seconds in drains), drains


@pytest.mark.parametrize("balancer", ["nginx", "haproxy"])
async def test_sigkill_ends_the_call_with_an_error_within_the_lease(
    deployment: Deployment, balancer: str
) -> None:
    url = deployment.nginx_url if balancer == "nginx" else deployment.haproxy_url
    progress: list[float] = []
    three = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)
        if len(progress) == 3:
            three.set()

    client = redis.Redis.from_url(deployment.redis.url)
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        failure: list[BaseException] = []
        ended = anyio.Event()

        async def call() -> None:
            try:
                await session.call_tool(
                    "countdown", {"n": 200, "interval_ms": 100}, progress_callback=on_progress
                )
            except MCPError as exc:
                failure.append(exc)
            ended.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(15):
                await three.wait()
            owners = {
                value.decode()
                for key in client.scan_iter(match="*:mcp:lease:*")
                if (value := client.get(key)) not in (None, b"-")
            }
            assert len(owners) == 1, owners
            victim = deployment.replica_of(owners.pop())
            killed = time.monotonic()
            victim.stop(signal.SIGKILL)
            with anyio.fail_after(LEASE + 8):
                await ended.wait()
            took = time.monotonic() - killed
        # The session lives on: its next call is served by a surviving replica.
        with anyio.fail_after(15):
            after = await session.call_tool("countdown", {"n": 2, "interval_ms": 0})
        assert after.content[0].text == "done 2"  # type: ignore[union-attr]
    client.close()
    victim.start()
    await anyio.to_thread.run_sync(victim.wait_healthy)
    if balancer == "haproxy":
        names = ["replica1", "replica2", "replica3"]
        await anyio.to_thread.run_sync(deployment.wait_haproxy, "UP", names)
    else:
        await anyio.sleep(NGINX_FAIL_TIMEOUT)
    assert failure and "request lost" in str(failure[0]), failure
    assert took <= LEASE + 5, took
    assert progress == [float(i) for i in range(1, len(progress) + 1)]


@contextlib.contextmanager
def _balancers_behind_a_cut(deployment: Deployment) -> Iterator[tuple[TcpProxy, int, int, Path]]:
    """Both balancers again, the first replica behind a proxy that can lose its answers."""
    cutter = TcpProxy([("127.0.0.1", deployment.replicas[0].port)]).start()
    ports = [cutter.port, *(r.port for r in deployment.replicas[1:])]
    work = Path(tempfile.mkdtemp(prefix="replaystore-retried-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        nginx_port, haproxy_port, socket_path = _start_balancers(work, ports, procs)
        _wait_haproxy(socket_path, "UP", ["replica1", "replica2", "replica3"])
        yield cutter, nginx_port, haproxy_port, socket_path
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        cutter.stop()
        shutil.rmtree(work, ignore_errors=True)


async def _stored_messages(deployment: Deployment, session: str, stream: str) -> list[Any]:
    """The messages the store holds for one request's stream."""
    async with ReplayBuffer.from_url(deployment.redis.url) as buffer:
        info = await buffer.session_info(session)
        assert info is not None
        stored = await buffer.resolve_and_replay(session, info.origin, stream)
    assert stored.ok
    return [json.loads(e.payload) for e in stored.events if e.payload is not None]


async def test_a_post_nginx_sends_again_after_its_replica_took_it_runs_once(
    deployment: Deployment,
) -> None:
    """A replica takes a POST, its answer is lost: nginx's retry gets the result of the one run.

    A proxy in front of the first replica lets the request through, then cuts
    the connection at the first byte of the answer: to nginx, an upstream
    that closed before its response header, so it sends the POST to the next
    replica (``proxy_next_upstream error ... non_idempotent``).
    """
    with _balancers_behind_a_cut(deployment) as (cutter, nginx_port, _, _):
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
            session = await RawSession(http, f"http://127.0.0.1:{nginx_port}/mcp").initialize()
            cut: tuple[int, list[SSE]] | None = None
            for attempt in range(12):  # round robin: until one lands on the cut replica
                token = f"cut-{attempt}-{os.urandom(4).hex()}"
                cutter.drop_reply_after(token.encode())
                request_id, body = session.call("countdown", {"n": 5, "interval_ms": 100}, token)
                events: list[SSE] = []
                with anyio.fail_after(30):
                    async with session.post(body) as response:
                        assert response.status_code == 200, await response.aread()
                        async for event in sse_events(response):
                            events.append(event)
                            if event.message and event.message.get("id") == request_id:
                                break
                if cutter.wait_dropped(0):
                    cut = (request_id, events)
                    break
            assert cut is not None, "nginx never sent a call to the first replica"
    request_id, events = cut
    assert [p for e in events if (p := progress_of(e)) is not None] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert result_text(events[-1], request_id) == "done 5"
    # The store holds one run of it: five progress notifications, one response.
    messages = await _stored_messages(deployment, session.session_id, str(request_id))
    assert len([m for m in messages if "id" in m]) == 1
    assert len([m for m in messages if m.get("method") == "notifications/progress"]) == 5


@pytest.mark.parametrize("balancer", ["nginx", "haproxy"])
async def test_a_post_sent_again_after_its_replica_was_killed_is_answered_lost(
    deployment: Deployment, balancer: str
) -> None:
    """The replica running a POST is SIGKILLed before answering; the balancer sends it again.

    The proxy in front of the first replica holds that replica's answer (the
    replica took the request and runs it); then the replica is killed: to the
    balancer, an upstream that closed without answering. The POST sent again
    gets "request lost" within the lease, and the tool does not run again.
    """
    victim = deployment.replicas[0]
    with _balancers_behind_a_cut(deployment) as (cutter, nginx_port, haproxy_port, _):
        port = nginx_port if balancer == "nginx" else haproxy_port
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
            session = await RawSession(http, f"http://127.0.0.1:{port}/mcp").initialize()
            found: tuple[int, list[SSE]] | None = None
            for attempt in range(12):  # round robin: until one lands on the first replica
                token = f"kill-{attempt}-{os.urandom(4).hex()}"
                cutter.stall_reply_after(token.encode(), 0)
                request_id, body = session.call("countdown", {"n": 20, "interval_ms": 100}, token)
                events: list[SSE] = []
                killed = anyio.Event()

                async def kill_when_held(killed: anyio.Event = killed) -> None:
                    if await anyio.to_thread.run_sync(cutter.wait_dropped, 3.0):
                        await anyio.sleep(0.5)  # the tool runs and reports progress
                        await anyio.to_thread.run_sync(victim.stop, signal.SIGKILL)
                        killed.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(kill_when_held)
                    with anyio.fail_after(30):
                        async with session.post(body) as response:
                            assert response.status_code == 200, await response.aread()
                            async for event in sse_events(response):
                                events.append(event)
                                if event.message and event.message.get("id") == request_id:
                                    break
                if killed.is_set():
                    found = (request_id, events)
                    break
            assert found is not None, f"{balancer} never sent a call to the first replica"
    victim.start()
    await anyio.to_thread.run_sync(victim.wait_healthy)
    await anyio.to_thread.run_sync(deployment.wait_haproxy, "UP", ["replica1"])
    request_id, events = found
    final = events[-1].message
    assert final is not None and final["error"]["message"] == (
        "request lost: the server replica that took it stopped, "
        "or lost its store, before answering it"
    ), final
    progress = [p for e in events if (p := progress_of(e)) is not None]
    assert progress and progress == [float(i) for i in range(1, len(progress) + 1)]
    # One run, stopped by the kill: what the store holds is what the client got.
    messages = await _stored_messages(deployment, session.session_id, str(request_id))
    assert [m for m in messages if "id" in m] == [final]
    assert len([m for m in messages if m.get("method") == "notifications/progress"]) == len(
        progress
    )


def test_store_outage_initialize_is_503_and_new_sessions_work_after(
    deployment: Deployment,
) -> None:
    old = httpx.post(deployment.haproxy_url, json=_initialize_body(), headers=_HEADERS, timeout=10)
    assert old.status_code == 200
    pid = deployment.redis.pids()[0]
    os.kill(pid, signal.SIGSTOP)  # a hung store: connections open, nothing answers
    try:
        for replica in deployment.replicas:
            started = time.monotonic()
            answer = httpx.get(f"{replica.base}/healthz", timeout=10)
            assert answer.status_code == 503 and "replay store" in answer.text, answer.text
            assert time.monotonic() - started < 3
        for url in (deployment.nginx_url, deployment.haproxy_url):
            started = time.monotonic()
            answer = httpx.post(url, json=_initialize_body(), headers=_HEADERS, timeout=20)
            assert answer.status_code == 503, (url, answer.status_code, answer.text)
            assert answer.headers.get("retry-after") == "1"
            assert time.monotonic() - started < 8
    finally:
        os.kill(pid, signal.SIGCONT)
    # The store comes back empty (a restart without persistence).
    deployment.redis.restart()
    for url in (deployment.nginx_url, deployment.haproxy_url):
        deadline = time.monotonic() + 15
        while True:
            answer = httpx.post(url, json=_initialize_body(), headers=_HEADERS, timeout=10)
            if answer.status_code == 200:
                break
            assert time.monotonic() < deadline, (url, answer.status_code, answer.text)
            time.sleep(0.3)
    deployment.wait_haproxy("UP", ["replica1", "replica2", "replica3"])
    # A session the store lost is a clean 404 on every replica, never a cut stream.
    session = old.headers["mcp-session-id"]
    headers = {**_HEADERS, "Mcp-Session-Id": session, "Mcp-Protocol-Version": PV}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    for replica in deployment.replicas:
        answer = httpx.post(f"{replica.base}/mcp", json=call, headers=headers, timeout=10)
        assert answer.status_code == 404, (answer.status_code, answer.text)


# ---------------------------------------------------------------- store outages, drains, bodies

#: The replicas' ``store_timeout``: how long a request waits for a store that does not answer.
STORE_TIMEOUT = DEFAULT_STORE_TIMEOUT
#: What a balancer may add to the replicas' own bound: one more replica tried, and slack.
OUTAGE_BOUND = 2 * STORE_TIMEOUT + 1.0


def _balancer_url(deployment: Deployment, balancer: str) -> str:
    return deployment.nginx_url if balancer == "nginx" else deployment.haproxy_url


def _assert_json_503(answer: httpx.Response, took: float, what: str) -> None:
    """A replica's (or a balancer's) outage answer: 503, a JSON-RPC error, Retry-After, in time."""
    assert answer.status_code == 503, (what, answer.status_code, answer.text[:300])
    assert answer.headers.get("retry-after") == "1", (what, dict(answer.headers))
    assert answer.headers.get("content-type", "").startswith("application/json"), (
        what,
        answer.text[:300],
    )
    body = answer.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == -32603, (what, body)
    assert body["error"]["message"].startswith("Service Unavailable"), (what, body)
    assert took <= OUTAGE_BOUND, (what, took)


def _wait_all_serving(deployment: Deployment) -> None:
    """Every replica healthy, HAProxy sees them UP, nginx has taken back any it left out."""
    for replica in deployment.replicas:
        replica.wait_healthy()
    deployment.wait_haproxy("UP", ["replica1", "replica2", "replica3"])
    time.sleep(NGINX_FAIL_TIMEOUT)
    for url in (deployment.nginx_url, deployment.haproxy_url):
        deadline = time.monotonic() + 15
        while True:
            answer = httpx.post(url, json=_initialize_body(), headers=_HEADERS, timeout=10)
            if answer.status_code == 200:
                break
            assert time.monotonic() < deadline, (url, answer.status_code, answer.text)
            time.sleep(0.3)


def _stream_cursor(url: str) -> tuple[str, str]:
    """A session opened through ``url`` and the id of an event of one of its streams."""
    init = httpx.post(url, json=_initialize_body(), headers=_HEADERS, timeout=10)
    assert init.status_code == 200, init.text
    session = init.headers["mcp-session-id"]
    headers = {**_HEADERS, "Mcp-Session-Id": session, "Mcp-Protocol-Version": PV}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert httpx.post(url, json=note, headers=headers, timeout=10).status_code == 202
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "countdown", "arguments": {"n": 2, "interval_ms": 0}},
    }
    answer = httpx.post(url, json=call, headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    ids = re.findall(r"(?m)^id: *(\S+)", answer.text)
    assert ids, answer.text
    return session, ids[-1]


@pytest.mark.parametrize("outage", ["hung", "down"])
@pytest.mark.parametrize("balancer", ["nginx", "haproxy"])
def test_store_outage_is_a_json_503_within_two_store_timeouts(
    deployment: Deployment, balancer: str, outage: str
) -> None:
    """Through either balancer, every request during a store outage gets what a replica says.

    ``hung``: Redis stopped (SIGSTOP), connections open and nothing answers,
    so each replica answers after its ``store_timeout``. ``down``: Redis
    killed, connections refused, so each replica answers at once; it comes
    back empty. Each ``initialize`` and each resume (GET + ``Last-Event-ID``)
    is ``503`` with a JSON-RPC error and ``Retry-After: 1`` within two
    ``store_timeout`` and a margin, however many arrive: never an HTML
    ``502`` from a balancer that left every replica out, never a request
    tried on each replica in turn.
    """
    _wait_all_serving(deployment)
    url = _balancer_url(deployment, balancer)
    session, cursor = _stream_cursor(url)
    resume = {
        "Accept": "text/event-stream",
        "Mcp-Session-Id": session,
        "Mcp-Protocol-Version": PV,
        "Last-Event-ID": cursor,
    }
    pid = deployment.redis.pids()[0]
    os.kill(pid, signal.SIGSTOP if outage == "hung" else signal.SIGKILL)
    try:
        for attempt in range(6):
            started = time.monotonic()
            answer = httpx.post(url, json=_initialize_body(), headers=_HEADERS, timeout=20)
            _assert_json_503(answer, time.monotonic() - started, f"initialize {attempt}")
            started = time.monotonic()
            answer = httpx.get(url, headers=resume, timeout=20)
            _assert_json_503(answer, time.monotonic() - started, f"resume {attempt}")
    finally:
        if outage == "hung":
            os.kill(pid, signal.SIGCONT)
        else:
            deployment.redis.restart()
    _wait_all_serving(deployment)


@pytest.mark.parametrize("balancer", ["nginx", "haproxy"])
async def test_a_draining_replica_is_retried_on_another_replica(
    deployment: Deployment, balancer: str
) -> None:
    """A replica told to stop answers new requests 503; through a balancer they succeed elsewhere.

    The replica is kept draining by a call it runs (on a session opened on it
    directly): its health check says ``draining``, it answers 503 what
    reaches it and soon refuses connections. Requests sent through the
    balancer meanwhile, round robin over all three, are each answered by a
    replica that stays: retrying once is enough for a drain.
    """
    await anyio.to_thread.run_sync(_wait_all_serving, deployment)
    victim = deployment.replicas[1]
    url = _balancer_url(deployment, balancer)
    assert victim.proc is not None
    statuses: list[tuple[int, str]] = []
    events: list[SSE] = []
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
            session = await RawSession(http, f"{victim.base}/mcp").initialize()
            request_id, body = session.call("countdown", {"n": 30, "interval_ms": 100}, "drain")
            with anyio.fail_after(30):
                async with session.post(body) as response:
                    assert response.status_code == 200, await response.aread()
                    async for event in sse_events(response):
                        events.append(event)
                        if progress_of(event) == 2.0:
                            victim.proc.send_signal(signal.SIGTERM)
                            for _ in range(9):
                                answer = await http.post(
                                    url, json=_initialize_body(), headers=_HEADERS
                                )
                                statuses.append((answer.status_code, answer.text[:200]))
                        if event.message and event.message.get("id") == request_id:
                            break
        assert [s for s in statuses if s[0] != 200] == [], statuses
        assert len(statuses) == 9
        # The replica was draining all along and ran its call to the end.
        assert result_text(events[-1], request_id) == "done 30"
    finally:
        await anyio.to_thread.run_sync(victim.stop)
        victim.start()
        await anyio.to_thread.run_sync(_wait_all_serving, deployment)


@pytest.mark.parametrize("balancer", ["nginx", "haproxy"])
async def test_a_task_answer_within_the_documented_limit_passes(
    deployment: Deployment, balancer: str
) -> None:
    """A ``tasks/update`` carrying a large answer (stored within 1 MiB, 1.5 MB as JSON) passes.

    The body the replicas refuse (above the SDK's 4 MiB) is refused with
    ``413`` by either the balancer or the replica.
    """
    await anyio.to_thread.run_sync(_wait_all_serving, deployment)
    url = _balancer_url(deployment, balancer)
    # 250 kB stored (twice in the result: its text and structured content),
    # each character escaped as \u0001 in JSON: a 1.5 MB body.
    name = "\x01" * 250_000

    async def answer(key: str, request: dict[str, Any]) -> dict[str, Any]:
        return {"action": "accept", "content": {"name": name}}

    async with TaskClient(url) as client:
        with anyio.fail_after(60):
            result = await client.call("ask", {}, on_input=answer)
    assert result.content[0].text == f"hello {name}"
    too_large = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "y" * (5 << 20)}}
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        refused = await http.post(url, json=too_large, headers=_HEADERS)
    assert refused.status_code == 413, refused.text[:300]

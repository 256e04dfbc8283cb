"""Tasks through a store stall and a balancer's errors: real Redis, real replicas, real nginx.

Each test starts its own ``redis-server`` on a free loopback port and stalls
it for real (``SIGSTOP``, then ``SIGCONT``, always), and its own
``replaystore example-server`` processes (and nginx, with a plain
reverse-proxy configuration of the kind users write), all stopped whatever
happens. What is checked:

- a task request the store does not serve is answered ``503`` with
  ``Retry-After`` within about ``store_timeout``, with a JSON-RPC error, as on
  a session;
- a ``tools/call`` sent again after that ``503`` (same JSON-RPC id) gets the one
  task its first copy created, which runs (a non-idempotent ``ask`` reaches
  ``input_required`` and completes), and the store holds exactly one task;
- a ``tools/call`` with a numeric id (as the SDK's client sends) answered
  ``503`` through an 8 s stall never runs, though its create reached the
  store; its retry with the same id runs once;
- ``TaskClient.call`` rides an 8 s Redis stall, a balancer's HTML ``502`` and
  refused connections, and returns the tool's result.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis

from replaystore.mcp.client.tasks import TaskClient
from replaystore.mcp.settings import DEFAULT_STORE_TIMEOUT
from replaystore.testing.servers import ServerHandle, find_free_port, redis_server_binary
from replaystore.testing.servers import start_standalone as start_redis

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

ROOT = Path(__file__).resolve().parents[3]
EXTENSION = "io.modelcontextprotocol/tasks"
VERSION = "2026-07-28"
#: A correctness bound, not a speed target: the old answer came after the Redis client's 5 s.
ANSWER_BOUND = DEFAULT_STORE_TIMEOUT + 2.5


@contextlib.contextmanager
def stalled(store: ServerHandle) -> Iterator[None]:
    """Redis stops answering (SIGSTOP) until the block ends (SIGCONT, always)."""
    pids = store.pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


class Replica:
    """One ``replaystore example-server`` on ``port``, started when asked, always stopped."""

    def __init__(self, port: int, store: str, logs: Path, kind: str = "sdk") -> None:
        self.port, self.store, self.logs, self.kind = port, store, logs, kind
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        if self.kind == "fastmcp":  # the same tools as tasks, on a FastMCP server
            module = ["tests.mcp.fastmcp_app", "--lease-seconds", "5"]
        else:
            module = ["replaystore", "example-server", "--host", "127.0.0.1"]
        args = [sys.executable, "-m", *module, "--port", str(self.port), "--url", self.store,
                "--log-level", "warning"]  # fmt: skip
        with (self.logs / f"replica-{self.port}.log").open("ab") as out:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url.replace("/mcp", "/healthz"), timeout=2).status_code == 200:
                    return
            assert time.monotonic() < deadline, f"replica on {self.port} not ready"
            time.sleep(0.1)

    def log(self) -> str:
        path = self.logs / f"replica-{self.port}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="replaystore-task-outages-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store() -> Iterator[ServerHandle]:
    with start_redis(redis_server_binary(), "redis") as handle:
        yield handle


@pytest.fixture
def replica(store: ServerHandle, work: Path, request: pytest.FixtureRequest) -> Iterator[Replica]:
    """An example-server; a FastMCP server with the same task tools for tests asking so."""
    kind = getattr(request, "param", "sdk")
    server = Replica(find_free_port(), f"{store.url}?prefix=out:", work, kind)
    try:
        server.start()
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _headers(method: str, name: str) -> dict[str, str]:
    return {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
        "Mcp-Name": name,
    }


def _body(request_id: str | int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
    }
    return {"jsonrpc": "2.0", "id": request_id, "method": method,
            "params": {**params, "_meta": meta}}  # fmt: skip


async def _post(
    http: httpx.AsyncClient, url: str, request_id: str | int, method: str, params: dict[str, Any]
) -> httpx.Response:
    name = params.get("name") or params.get("taskId") or ""
    return await http.post(
        url, json=_body(request_id, method, params), headers=_headers(method, name)
    )


def _task_keys(store: ServerHandle) -> list[bytes]:
    with redis.Redis(port=store.ports[0]) as client:
        return sorted(client.scan_iter(match="out:*{task:*}:task"))


async def _until(
    http: httpx.AsyncClient, url: str, task_id: str, statuses: set[str]
) -> dict[str, Any]:
    with anyio.fail_after(60):
        while True:
            answer = await _post(http, url, uuid.uuid4().hex, "tasks/get", {"taskId": task_id})
            assert answer.status_code == 200, answer.text
            task: dict[str, Any] = answer.json()["result"]
            if task["status"] in statuses:
                return task
            await anyio.sleep(0.1)


def _unavailable(answer: httpx.Response, started: float, request_id: str | int) -> None:
    """A 503 with Retry-After and the request's JSON-RPC error, within the bound."""
    took = time.monotonic() - started
    assert answer.status_code == 503, (answer.status_code, answer.text)
    assert answer.headers.get("retry-after") == "1"
    body = answer.json()
    assert body["id"] == request_id and body["error"]["code"] == -32603, body
    assert body["error"]["data"]["reason"] == "storage_error", body
    assert took < ANSWER_BOUND, f"answered after {took:.1f} s"


@pytest.mark.parametrize("replica", ["sdk", "fastmcp"], indirect=True)
async def test_task_requests_the_store_does_not_serve_are_503_with_retry_after(
    store: ServerHandle, replica: Replica
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        created = await _post(
            http, replica.url, uuid.uuid4().hex, "tools/call",
            {"name": "countdown", "arguments": {"n": 2}},
        )  # fmt: skip
        task_id = created.json()["result"]["taskId"]
        await _until(http, replica.url, task_id, {"completed"})
        with stalled(store):
            for method, params in (
                ("tools/call", {"name": "countdown", "arguments": {"n": 3}}),
                ("tasks/get", {"taskId": task_id}),
                ("tasks/cancel", {"taskId": task_id}),
                ("tasks/update", {"taskId": task_id, "inputResponses": {}}),
            ):
                request_id = uuid.uuid4().hex
                started = time.monotonic()
                answer = await _post(http, replica.url, request_id, method, params)
                _unavailable(answer, started, request_id)
        # Served again once the store is: nothing of the outage remains.
        again = await _post(http, replica.url, uuid.uuid4().hex, "tasks/get", {"taskId": task_id})
        assert again.status_code == 200 and again.json()["result"]["status"] == "completed"


async def test_a_cancel_answered_503_may_have_been_made_and_repeating_it_is_safe(
    store: ServerHandle, replica: Replica
) -> None:
    """As docs/tasks.md says: after a 503 the task is cancelled or still runs; a repeat ends it."""
    async with httpx.AsyncClient(timeout=30) as http:
        created = await _post(
            http, replica.url, uuid.uuid4().hex, "tools/call",
            {"name": "countdown", "arguments": {"n": 100_000, "interval_ms": 100}},
        )  # fmt: skip
        task_id = created.json()["result"]["taskId"]
        with stalled(store):
            request_id = uuid.uuid4().hex
            started = time.monotonic()
            answer = await _post(http, replica.url, request_id, "tasks/cancel", {"taskId": task_id})
            _unavailable(answer, started, request_id)
        read = await _post(http, replica.url, uuid.uuid4().hex, "tasks/get", {"taskId": task_id})
        assert read.json()["result"]["status"] in {"working", "cancelled"}, read.text
        again = await _post(
            http, replica.url, uuid.uuid4().hex, "tasks/cancel", {"taskId": task_id}
        )
        assert again.status_code == 200 and "error" not in again.json(), again.text
        await _until(http, replica.url, task_id, {"cancelled"})


async def test_a_full_redis_is_503_on_the_task_path_and_tasks_go_on(
    store: ServerHandle, replica: Replica
) -> None:
    """Writes refused (out of memory): a create is 503 naming it; reads are served; then all is."""
    async with httpx.AsyncClient(timeout=30) as http:
        created = await _post(
            http, replica.url, uuid.uuid4().hex, "tools/call",
            {"name": "countdown", "arguments": {"n": 100_000, "interval_ms": 100}},
        )  # fmt: skip
        task_id = created.json()["result"]["taskId"]
        with redis.Redis(port=store.ports[0]) as admin:
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)  # every write Redis checks is refused from now on
            try:
                request_id = uuid.uuid4().hex
                started = time.monotonic()
                answer = await _post(
                    http, replica.url, request_id, "tools/call",
                    {"name": "countdown", "arguments": {"n": 3}},
                )  # fmt: skip
                _unavailable(answer, started, request_id)
                assert answer.json()["error"]["data"]["store"] == "oom", answer.text
                assert "refused" in answer.json()["error"]["message"], answer.text
                read = await _post(
                    http, replica.url, uuid.uuid4().hex, "tasks/get", {"taskId": task_id}
                )
                assert read.status_code == 200, read.text
                assert read.json()["result"]["status"] == "working", read.text
            finally:
                admin.config_set("maxmemory", 0)
        cancel = await _post(
            http, replica.url, uuid.uuid4().hex, "tasks/cancel", {"taskId": task_id}
        )
        assert cancel.status_code == 200, cancel.text
        await _until(http, replica.url, task_id, {"cancelled"})
        retry = await _post(
            http, replica.url, uuid.uuid4().hex, "tools/call",
            {"name": "countdown", "arguments": {"n": 2}},
        )  # fmt: skip
        assert retry.status_code == 200, retry.text
        done = await _until(http, replica.url, retry.json()["result"]["taskId"], {"completed"})
        assert done["result"]["content"][0]["text"] == "done 2"


@pytest.mark.parametrize("replica", ["sdk", "fastmcp"], indirect=True)
@pytest.mark.parametrize("stall", [3.0, 7.0], ids=["shorter-than-redis-timeout", "longer"])
async def test_a_tools_call_sent_again_after_a_503_gets_the_one_task_it_created(
    store: ServerHandle, replica: Replica, stall: float
) -> None:
    request_id = f"call-{uuid.uuid4().hex}"
    params = {"name": "ask", "arguments": {"question": "Who?"}}
    async with httpx.AsyncClient(timeout=30) as http:
        with stalled(store):
            started = time.monotonic()
            answer = await _post(http, replica.url, request_id, "tools/call", params)
            _unavailable(answer, started, request_id)
            # The create sent to the stalled store may yet be stored.
            await anyio.sleep(stall - (time.monotonic() - started))
        ids = set()
        for _ in range(3):  # the client's retries, after the store is back
            with anyio.fail_after(30):
                while True:
                    answer = await _post(http, replica.url, request_id, "tools/call", params)
                    if answer.status_code != 503:
                        break
                    await anyio.sleep(0.2)
            assert answer.status_code == 200, answer.text
            result = answer.json()["result"]
            assert result["resultType"] == "task", result
            ids.add(result["taskId"])
        assert len(ids) == 1, ids
        (task_id,) = ids
        # It runs (a non-idempotent tool: no lapse, no re-run), and asks once.
        task = await _until(http, replica.url, task_id, {"input_required", "failed", "completed"})
        assert task["status"] == "input_required", task
        (key,) = task["inputRequests"]
        answered = await _post(
            http, replica.url, uuid.uuid4().hex, "tasks/update",
            {"taskId": task_id,
             "inputResponses": {key: {"action": "accept", "content": {"name": "Ada"}}}},
        )  # fmt: skip
        assert answered.status_code == 200, answered.text
        done = await _until(http, replica.url, task_id, {"completed", "failed", "cancelled"})
        assert done["status"] == "completed", done
        assert "Ada" in json.dumps(done["result"])
        assert len(_task_keys(store)) == 1, _task_keys(store)


def _running(store: ServerHandle) -> set[str]:
    """The ids of the tasks the store holds that have not ended."""
    with redis.Redis(port=store.ports[0]) as client:
        found = set()
        for key in client.scan_iter(match="out:*{task:*}:task"):
            status = client.hget(key, "st")
            if status not in (b"completed", b"failed", b"cancelled"):
                found.add(key.decode().split("{task:")[1].split("}")[0].rsplit(":", 1)[-1])
        return found


async def test_a_creation_answered_503_with_a_numeric_id_never_runs(
    store: ServerHandle, replica: Replica
) -> None:
    """The SDK's client numbers its requests: no task its client never learned of runs."""
    params = {"name": "countdown", "arguments": {"n": 100_000, "interval_ms": 100}}
    async with httpx.AsyncClient(timeout=30) as http:
        # A first task: the replica's connections to the store are open when it stalls,
        # so the next create is sent, and stored as the store wakes.
        first = await _post(http, replica.url, 6, "tools/call", {**params, "arguments": {"n": 1}})
        await _until(http, replica.url, first.json()["result"]["taskId"], {"completed"})
        with stalled(store):
            started = time.monotonic()
            answer = await _post(http, replica.url, 7, "tools/call", params)
            _unavailable(answer, started, 7)
            await anyio.sleep(8.0 - (time.monotonic() - started))  # an 8 s stall
        with anyio.fail_after(30):
            while True:  # the client's retry, same id, once the store is back
                answer = await _post(http, replica.url, 7, "tools/call", params)
                if answer.status_code != 503:
                    break
                await anyio.sleep(0.2)
        assert answer.status_code == 200, answer.text
        known = answer.json()["result"]["taskId"]
        # Within the lease (5 s) of a create stored as the store woke: nothing else runs.
        for _ in range(20):
            if (running := _running(store)) == {known}:
                break
            await anyio.sleep(0.2)
        assert running == {known}, (known, running)
        # The create of the 503 was stored (or its id taken first) and ended unrun.
        assert len(_task_keys(store)) == 3, _task_keys(store)
        cancel = await _post(http, replica.url, uuid.uuid4().hex, "tasks/cancel", {"taskId": known})
        assert cancel.status_code == 200, cancel.text


async def test_task_client_call_of_a_countdown_rides_an_8s_redis_stall(
    store: ServerHandle, replica: Replica
) -> None:
    results: dict[str, Any] = {}

    async def call(name: str, n: int) -> None:
        async with TaskClient(replica.url) as client:
            results[name] = await client.call("countdown", {"n": n, "interval_ms": 100})

    with anyio.fail_after(180):
        async with anyio.create_task_group() as group:
            group.start_soon(call, "before", 30)  # running when the stall begins
            await anyio.sleep(1.0)
            with stalled(store):
                group.start_soon(call, "during", 5)  # created through the stall
                await anyio.sleep(8.0)
    assert results["before"].content[0].text == "done 30", results
    assert results["during"].content[0].text == "done 5", results
    assert len(_task_keys(store)) == 2, _task_keys(store)


def _nginx(work: Path, upstream: int) -> tuple[subprocess.Popen[bytes], int]:
    """nginx as a plain reverse proxy to ``upstream``: its own HTML 502 when that is down."""
    if shutil.which("nginx") is None:
        pytest.fail("nginx is required on PATH for this test (apt-get install nginx)")
    work.chmod(0o755)
    port = find_free_port()
    temp = " ".join(
        f"{kind}_temp_path {work}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (work / "nginx.conf").write_text(
        f"daemon off;\nworker_processes 1;\npid {work}/nginx.pid;\n"
        f"error_log {work}/nginx-error.log warn;\nevents {{ worker_connections 64; }}\n"
        f"http {{ access_log off; {temp}\n"
        f"  server {{ listen 127.0.0.1:{port};\n"
        f"    location / {{ proxy_pass http://127.0.0.1:{upstream};\n"
        f"      proxy_set_header Host $http_host; proxy_http_version 1.1;\n"
        f"      proxy_buffering off; }} }} }}\n"
    )
    args = ["nginx", "-p", str(work), "-e", str(work / "nginx-error.log"),
            "-c", str(work / "nginx.conf")]  # fmt: skip
    with (work / "nginx.out").open("wb") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    deadline = time.monotonic() + 15
    while True:
        assert proc.poll() is None, (work / "nginx.out").read_text()
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        assert time.monotonic() < deadline, "nginx does not listen"
        time.sleep(0.05)


async def test_task_client_rides_a_balancers_html_502_until_a_replica_answers(
    store: ServerHandle, work: Path
) -> None:
    server = Replica(find_free_port(), f"{store.url}?prefix=out:", work)
    (work / "nginx").mkdir()
    nginx, port = _nginx(work / "nginx", server.port)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        async with httpx.AsyncClient(timeout=10) as http:
            page = await http.post(url, json={})
        assert page.status_code == 502 and "html" in page.headers["content-type"], page.text
        results: dict[str, Any] = {}

        async def call() -> None:
            async with TaskClient(url) as client:
                results["call"] = await client.call("countdown", {"n": 3})

        with anyio.fail_after(180):
            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await anyio.sleep(1.0)  # the call meets nginx's 502 page meanwhile
                server.start()
        assert results["call"].content[0].text == "done 3", results
    finally:
        server.stop()
        if nginx.poll() is None:
            nginx.terminate()
            try:
                nginx.wait(10)
            except subprocess.TimeoutExpired:
                nginx.kill()
                nginx.wait(5)


async def test_task_client_rides_refused_connections_until_its_server_starts(
    store: ServerHandle, work: Path
) -> None:
    server = Replica(find_free_port(), f"{store.url}?prefix=out:", work)
    results: dict[str, Any] = {}

    async def call() -> None:
        async with TaskClient(server.url) as client:
            results["call"] = await client.call("countdown", {"n": 3})

    try:
        with anyio.fail_after(180):
            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await anyio.sleep(1.0)  # nothing listens yet: each connection is refused
                server.start()
        assert results["call"].content[0].text == "done 3", results
    finally:
        server.stop()

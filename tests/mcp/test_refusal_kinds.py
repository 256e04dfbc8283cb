"""Each way a real Redis refuses commands, over HTTP: 503 naming it on every path, then all goes on.

Two example-server replicas on a Redis of this module alone. Each test
provokes one condition on that Redis for real and, while it lasts, sends every
MCP request a client can send: an ``initialize``, a request on an existing
session (on the replica serving it and on one that adopts it), a resume
(``GET`` with ``Last-Event-ID``), a plain ``GET``, a ``DELETE`` and a task
call (protocol 2026-07-28). Each is answered ``503`` with ``Retry-After`` and a
JSON-RPC error naming the condition (or, for a resume whose reads Redis still
serves, the exact replay), never ``500``, never a cut response; ``/healthz``
is ``503`` naming it too. Once the condition clears, the same sessions go on
on either replica, and no replica logged a traceback.

- READONLY: Redis is made a replica of an address nothing listens on.
- MISCONF: a background save whose child is killed, with
  ``stop-writes-on-bgsave-error`` (and a save point, without which Redis
  does not stop writes).
- BUSY: a script that loops until ``SCRIPT KILL``, past ``busy-reply-threshold``.
- LOADING: a restart that loads a snapshot of many keys slowly (the hidden
  ``key-load-delay`` setting), cut short by setting it to 0 once checked.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
import redis

from replaystore.testing.mcp import initialize_message
from replaystore.testing.servers import ServerHandle, find_free_port
from replaystore.testing.sse import sse_events
from tests.mcp._support import RawSession, ServerProcess, replica_pair, result_text

pytestmark = pytest.mark.anyio

#: Seconds a condition may take to set in or to clear on a loaded machine.
SETTLE = 20.0
#: Keys of the snapshot the LOADING test loads (one ``key-load-delay`` each).
FILLER = 20_000


@pytest.fixture(scope="module")
def replicas(
    store: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    logs = tmp_path_factory.mktemp("refusal-kinds")
    url = f"{store.url}?prefix=rk:"
    with replica_pair(url, logs) as started:
        yield started


def _admin(store: ServerHandle) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=store.ports[0], socket_timeout=5)


def _until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` (a Redis probe) until it holds; fail after SETTLE seconds."""
    deadline = time.monotonic() + SETTLE
    while not check():
        assert time.monotonic() < deadline, f"not reached within {SETTLE:g} s: {what}"
        time.sleep(0.02)


def _refuses(call: Callable[[], object], code: str) -> Callable[[], bool]:
    """A probe: whether ``call`` is refused with Redis error ``code``."""

    def probe() -> bool:
        try:
            call()
        except redis.RedisError as exc:
            # redis-py drops the code of the errors it has a class for.
            named = {"READONLY": redis.ReadOnlyError, "LOADING": redis.BusyLoadingError}
            return code in str(exc) or isinstance(exc, named.get(code, ()))
        return False

    return probe


# -------------------------------------------------------------- the conditions


@contextlib.contextmanager
def _read_only(store: ServerHandle) -> Iterator[None]:
    """A replica of an address nothing listens on: reads served, writes refused."""
    admin = _admin(store)
    admin.replicaof("127.0.0.1", str(find_free_port()))
    try:
        _until(_refuses(lambda: admin.set("rk:probe", 1), "READONLY"), "READONLY")
        yield
    finally:
        admin.replicaof("NO", "ONE")
        admin.close()


@contextlib.contextmanager
def _cannot_persist(store: ServerHandle) -> Iterator[None]:
    """A background save that failed (its child killed): writes refused with MISCONF."""
    admin = _admin(store)
    admin.config_set("save", "3600 1")  # no save point: Redis does not stop writes
    admin.config_set("stop-writes-on-bgsave-error", "yes")
    admin.config_set("rdb-key-save-delay", 1_000_000)  # a child that takes its time
    try:
        admin.bgsave()
        (pid,) = store.pids()
        children: list[str] = []

        def forked() -> bool:
            out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
            children[:] = out.stdout.split()
            return bool(children)

        _until(forked, "the background save's child")
        for child in children:
            subprocess.run(["kill", "-KILL", child], check=False)
        _until(_refuses(lambda: admin.set("rk:probe", 1), "MISCONF"), "MISCONF")
        yield
    finally:
        admin.config_set("stop-writes-on-bgsave-error", "no")
        admin.config_set("rdb-key-save-delay", 0)
        admin.config_set("save", "")
        admin.close()


@contextlib.contextmanager
def _busy(store: ServerHandle) -> Iterator[None]:
    """A script that loops until killed: every other client is answered BUSY."""
    admin = _admin(store)
    admin.config_set("busy-reply-threshold", 100)
    looping = redis.Redis(host="127.0.0.1", port=store.ports[0])
    ended: list[BaseException] = []

    def loop() -> None:
        try:
            looping.eval("while true do end", 0)
        except redis.RedisError as exc:  # "Script killed by user": the expected end
            ended.append(exc)

    runner = threading.Thread(target=loop, daemon=True)
    runner.start()
    try:
        _until(_refuses(admin.ping, "BUSY"), "BUSY")
        yield
    finally:
        _until(_killed(admin), "SCRIPT KILL")
        runner.join(SETTLE)
        looping.close()
        admin.close()
    assert ended and "killed" in str(ended[0]).lower(), ended


def _killed(admin: redis.Redis) -> Callable[[], bool]:
    def kill() -> bool:
        try:
            admin.script_kill()
        except redis.RedisError as exc:
            return "NOTBUSY" in str(exc) or "No scripts" in str(exc)
        return False

    return kill


@contextlib.contextmanager
def _loading(store: ServerHandle) -> Iterator[None]:
    """A restart that loads many keys slowly; the load is sped up once the checks are done."""
    admin = _admin(store)
    with admin.pipeline(transaction=False) as pipe:
        for i in range(FILLER):
            pipe.set(f"filler:{i}", "x")
        pipe.execute()
    failed: list[BaseException] = []

    def restart() -> None:
        try:
            store.restart(
                keep_data=True,
                options=[
                    "--key-load-delay", "1000",  # microseconds per key: 20 s in all
                    "--loading-process-events-interval-bytes", "1024",  # answer while loading
                ],
                loaded=False,  # up while loading: the test decides when loading ends
            )  # fmt: skip
        except BaseException as exc:  # told by the test, not lost in the thread
            failed.append(exc)

    restarting = threading.Thread(target=restart, daemon=True)
    restarting.start()
    try:
        _until(_refuses(admin.ping, "LOADING"), "LOADING")
        yield
    finally:
        with contextlib.suppress(redis.RedisError):
            admin.config_set("key-load-delay", 0)  # served while loading: the rest loads at once
        restarting.join(SETTLE * 3)
        _until(lambda: not _refuses(admin.ping, "LOADING")(), "loaded")
        admin.delete(*[f"filler:{i}" for i in range(FILLER)])
        admin.close()
    assert not failed and not restarting.is_alive(), failed


@dataclass(frozen=True)
class Condition:
    name: str
    provoke: Callable[[ServerHandle], contextlib.AbstractContextManager[None]]
    #: Words of the error a client gets (what replaystore says the code means).
    named: str
    #: The ``data.store`` of that error.
    kind: str
    #: Whether Redis still serves reads (a resume may then be answered 200).
    reads: bool


CONDITIONS = [
    Condition("READONLY", _read_only, "read-only replica", "readonly", reads=True),
    Condition("MISCONF", _cannot_persist, "cannot persist (MISCONF)", "misconf", reads=True),
    Condition("BUSY", _busy, "busy running a script", "busy", reads=False),
    Condition("LOADING", _loading, "loading its data set", "loading", reads=False),
]


# ------------------------------------------------------------------- the test


@pytest.mark.parametrize("condition", CONDITIONS, ids=[c.name for c in CONDITIONS])
async def test_each_refusal_is_503_naming_it_on_every_path_and_the_sessions_go_on(
    condition: Condition,
    replicas: list[ServerProcess],
    store: ServerHandle,
    http: httpx.AsyncClient,
) -> None:
    a, b = replicas
    session = await RawSession(http, a.url).initialize()
    doomed = await RawSession(http, a.url).initialize()
    request_id, body = session.call("countdown", {"n": 3, "interval_ms": 0}, token="t")
    async with session.post(body) as response:
        events = [event async for event in sse_events(response)]
    assert result_text(events[-1], request_id) == "done 3"
    cursor = next(e.id for e in events if e.priming and e.id)
    with condition.provoke(store):
        with anyio.fail_after(SETTLE):
            await _every_path_refused(http, condition, a, b, session, doomed, cursor)
    # Cleared: the same sessions go on, on either replica; nothing was cut.
    for _ in range(int(SETTLE * 10)):
        if (await http.get(f"{a.base}/healthz")).status_code == 200:
            break
        await anyio.sleep(0.1)
    assert await session.ping_status() == 200
    assert await doomed.ping_status() == 200  # its DELETE was refused: it lives on
    assert await session.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"
    elsewhere = RawSession(http, b.url, session.session_id, next_id=1000)
    assert await elsewhere.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"
    async with session.get(cursor) as response:  # the first call's stream, replayed exactly
        assert response.status_code == 200
        replayed = [e async for e in sse_events(response)]
    assert result_text(replayed[-1], request_id) == "done 3"
    for server in (a, b):
        assert (await http.get(f"{server.base}/healthz")).status_code == 200
        log = server.log_tail(2000)
        assert "Traceback" not in log and "without completing response" not in log, log


async def _every_path_refused(
    http: httpx.AsyncClient,
    condition: Condition,
    a: ServerProcess,
    b: ServerProcess,
    session: RawSession,
    doomed: RawSession,
    cursor: str,
) -> None:
    def refused(response: httpx.Response, *, request_id: object = None) -> None:
        assert response.status_code == 503, (response.status_code, response.text)
        assert response.headers["retry-after"] == "1"
        error = response.json()["error"]
        assert condition.named in error["message"], error
        assert error["data"]["reason"] == "storage_error", error
        assert error["data"].get("store") == condition.kind, error
        if request_id is not None:
            assert response.json()["id"] == request_id

    fresh = RawSession(http, a.url).headers()
    refused(await http.post(a.url, json=initialize_message(), headers=fresh))
    _, ping = session.request("ping", {})
    refused(await http.post(a.url, json=ping, headers=session.headers()))
    _, call = session.call("countdown", {"n": 2, "interval_ms": 0})
    refused(await http.post(a.url, json=call, headers=session.headers()))
    # Another replica adopts the session from the store: refused alike.
    refused(await http.post(b.url, json=ping, headers=session.headers()))
    # A resume: exact while Redis serves reads, or refused; never a 500.
    async with session.get(cursor) as response:
        if condition.reads and response.status_code == 200:
            replayed = [e async for e in sse_events(response)]
            assert replayed[-1].message and "result" in replayed[-1].message, replayed
        else:
            await response.aread()
            refused(response)
    # The standalone GET stream: refused (its mark cannot be kept).
    async with session.get() as response:
        await response.aread()
        refused(response)
    refused(await http.delete(a.url, headers=doomed.headers()))
    request_id = uuid.uuid4().hex
    refused(
        await http.post(a.url, json=_task_call(request_id), headers=_task_headers()),
        request_id=request_id,
    )
    for server in (a, b):
        health = await http.get(f"{server.base}/healthz")
        assert health.status_code == 503 and condition.named in health.text, health.text


#: A ``tools/call`` that creates a task (protocol 2026-07-28, tasks extension).
_TASKS = "io.modelcontextprotocol/tasks"
_MODERN = "2026-07-28"


def _task_call(request_id: str) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": _MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {_TASKS: {}}},
    }
    params = {"name": "countdown", "arguments": {"n": 2}, "_meta": meta}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _task_headers() -> dict[str, str]:
    return {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": _MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "countdown",
    }

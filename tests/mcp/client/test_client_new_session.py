"""A client never sticks to a dead session: every 404 says why, and the shipped client starts anew.

Against real processes: a Redis of this module alone (restarted empty by one
test) and one server process serving the SDK wiring (the example server's
app) and the FastMCP wiring, each on its own port. The client is the shipped
:class:`ResumingSession`; another connection is plain httpx.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.server import MCPServer
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from replaystore import ReplayBuffer, ResumptionDesyncError, Verdict
from replaystore.mcp import streamable_http_app
from replaystore.mcp.client import DesyncWatch, ResumingSession
from replaystore.testing.servers import ServerHandle
from replaystore.verdicts import reason_text
from tests.mcp._support import RawSession, ServerProcess, spawn_many, wait_ready
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.anyio

NO_SESSION = "the session does not exist"


@pytest.fixture(scope="module")
def store(real_servers: RealServers) -> Iterator[ServerHandle]:
    handle = real_servers.own("redis")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def apps(
    store: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    logs = tmp_path_factory.mktemp("new-session")
    specs = {
        "sdk": ("sdk", f"{store.url}?prefix=newsession1:", 1_000),
        "fastmcp": ("fastmcp", f"{store.url}?prefix=newsession2:", 1_000),
    }
    servers = spawn_many("new-session", specs, logs)
    try:
        wait_ready(list(servers.values()))
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture
async def http() -> Any:
    async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as client:
        yield client


async def _kill_with_junk_cursor(http: httpx.AsyncClient, url: str, session_id: str) -> None:
    """Another connection resumes the session from a junk id: a failed verdict ends it."""
    raw = RawSession(http, url, session_id=session_id)
    async with raw.get("junk") as response:
        assert response.status_code == 404
        body = await response.aread()
    assert b"malformed_cursor" in body


async def _404_data(raw: RawSession, method: str) -> dict[str, Any]:
    """The JSON-RPC error ``data`` of the 404 answering ``method`` for ``raw``'s session."""
    if method == "POST":
        _, body = raw.request("tools/list", {})
        response = await raw.client.post(raw.url, json=body, headers=raw.headers())
    elif method == "DELETE":
        response = await raw.client.delete(raw.url, headers=raw.headers())
    else:
        cursor = {"GET": None, "GET+Last-Event-ID": "0"}[method]
        async with raw.get(cursor) as response:
            await response.aread()
    assert response.status_code == 404, (method, response.text)
    error = response.json()["error"]
    assert isinstance(error.get("data"), dict), (method, error)
    assert error["data"]["verdict"] in error["message"]
    data: dict[str, Any] = error["data"]
    return data


METHODS = ["POST", "GET", "GET+Last-Event-ID", "DELETE"]


@pytest.mark.parametrize("wiring", ["sdk", "fastmcp"])
async def test_every_404_names_its_verdict_and_why_the_session_ended(
    apps: dict[str, ServerProcess], http: httpx.AsyncClient, wiring: str
) -> None:
    url = apps[wiring].url
    with anyio.fail_after(30):
        never = RawSession(http, url, session_id="f" * 32)
        for method in METHODS:
            data = await _404_data(never, method)
            assert data["verdict"] == "unknown_session"
            assert data["evidence"] == {"session": "f" * 32, "reason": NO_SESSION}

        torn = await RawSession(http, url).initialize()
        await _kill_with_junk_cursor(http, url, torn.session_id)
        for method in METHODS:
            data = await _404_data(torn, method)
            assert data["verdict"] == "unknown_session", method
            evidence = data["evidence"]
            assert evidence["session"] == torn.session_id
            assert evidence["tombstone"]["verdict"] == "malformed_cursor", (method, evidence)

        closed = await RawSession(http, url).initialize()
        assert (await http.delete(url, headers=closed.headers())).status_code == 200
        data = await _404_data(closed, "POST")
        assert data["evidence"]["reason"] == "the session was closed"
        assert "tombstone" in data["evidence"] and "verdict" not in data["evidence"]["tombstone"]


class _Told:
    """``on_new_session``: what it was told, each time."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple[Any, ResumptionDesyncError]] = []
        self.delay = delay

    async def __call__(self, session: Any, ended: ResumptionDesyncError) -> None:
        await anyio.sleep(self.delay)
        self.calls.append((session, ended))


async def _countdown(mcp: ResumingSession, n: int = 2) -> str:
    result = await mcp.call_tool("countdown", {"n": n, "interval_ms": 0})
    text: str = result.content[0].text
    return text


async def test_next_call_succeeds_after_another_connection_ended_the_session(
    apps: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    url = apps["sdk"].url
    told = _Told()
    with anyio.fail_after(30):
        async with ResumingSession(url, on_new_session=told) as mcp:
            assert await _countdown(mcp) == "done 2"
            first = mcp.session_id
            assert first is not None
            await _kill_with_junk_cursor(http, url, first)

            # Two calls at once meet the 404: each is sent again, on one new session.
            results: list[str] = []
            async with anyio.create_task_group() as group:
                for n in (3, 4):
                    group.start_soon(lambda n=n: _collect(_countdown(mcp, n), results))
            assert sorted(results) == ["done 3", "done 4"]
            assert mcp.session_id not in (None, first)
            assert len(told.calls) == 1
            session, ended = told.calls[0]
            assert session is mcp.session
            assert ended.verdict is Verdict.UNKNOWN_SESSION
            tombstone = ended.resumption.evidence.tombstone
            assert tombstone is not None and tombstone.verdict is Verdict.MALFORMED_CURSOR

            assert await _countdown(mcp) == "done 2"  # and the new session stays
            assert len(told.calls) == 1


async def test_next_call_succeeds_after_the_store_restarted_empty(
    apps: dict[str, ServerProcess], store: ServerHandle
) -> None:
    told = _Told()
    with anyio.fail_after(40):
        async with ResumingSession(apps["sdk"].url, on_new_session=told) as mcp:
            assert await _countdown(mcp) == "done 2"
            first = mcp.session_id
            store.restart()  # SIGKILL, no data kept: every session is gone

            assert await _countdown(mcp, 3) == "done 3"
            assert mcp.session_id not in (None, first)
            assert len(told.calls) == 1
            ended = told.calls[0][1]
            assert ended.verdict is Verdict.UNKNOWN_SESSION
            # No tombstone survives; the replica that was serving it says so.
            assert ended.resumption.evidence.reason == reason_text("vanished")
            assert await _countdown(mcp) == "done 2"
            assert len(told.calls) == 1


async def test_a_new_session_opened_under_a_callers_deadline_outlives_it(
    apps: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    url = apps["sdk"].url
    told = _Told(delay=0.5)  # restoring state takes longer than the caller waits
    with anyio.fail_after(30):
        async with ResumingSession(url, on_new_session=told) as mcp:
            first = mcp.session_id
            assert first is not None
            await _kill_with_junk_cursor(http, url, first)
            with anyio.move_on_after(0.3) as deadline:
                await _countdown(mcp)  # meets the 404; the new session is still opening
            assert deadline.cancelled_caught
            assert not told.calls

            # Outside the scope: the session opened under it is whole, and no
            # cancellation reaches it or the calls made on it.
            assert await _countdown(mcp, 3) == "done 3"
            second = mcp.session_id
            assert second not in (None, first)
            assert len(told.calls) == 1

            # A renewal that completes inside a caller's deadline, then the
            # scope closes: later calls run on that session, unharmed.
            await _kill_with_junk_cursor(http, url, second)  # type: ignore[arg-type]
            with anyio.fail_after(10):
                assert await _countdown(mcp) == "done 2"
            third = mcp.session_id
            assert third not in (None, first, second)
            await anyio.sleep(0.2)
            assert await _countdown(mcp, 4) == "done 4"
            assert mcp.session_id == third
            assert len(told.calls) == 2


async def test_the_sdks_own_client_with_the_watch_hears_why_its_session_ended(
    apps: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    url, watch = apps["fastmcp"].url, DesyncWatch()
    with anyio.fail_after(30):
        async with (
            watch.client_factory() as client,
            streamable_http_client(url, http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert watch.session_id is not None
            await _kill_with_junk_cursor(http, url, watch.session_id)
            with pytest.raises(MCPError):
                await session.list_tools()
    ended = watch.pop()
    assert ended is not None and ended.verdict is Verdict.UNKNOWN_SESSION
    tombstone = ended.resumption.evidence.tombstone
    assert tombstone is not None and tombstone.verdict is Verdict.MALFORMED_CURSOR


class _Tokens:
    async def verify_token(self, token: str) -> AccessToken | None:
        return AccessToken(token=token, client_id=token, scopes=[], subject=token)


async def test_another_credentials_404_is_a_never_issued_sessions() -> None:
    """A session asked for with another credential than its creator's: nothing says it exists."""
    auth = AuthSettings(
        issuer_url="https://id.example",  # type: ignore[arg-type]
        resource_server_url="http://127.0.0.1:8000/mcp",  # type: ignore[arg-type]
        validate_token_resource=False,
    )
    buffer = ReplayBuffer.from_url("memory://")
    app = streamable_http_app(MCPServer("owned", token_verifier=_Tokens(), auth=auth), buffer)
    async with (
        buffer,
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000"
        ) as client,
    ):
        owner = RawSession(client, "/mcp")
        client.headers["authorization"] = "Bearer ada"
        await owner.initialize()
        client.headers["authorization"] = "Bearer eve"
        stranger = RawSession(client, "/mcp", session_id=owner.session_id)
        nobody = RawSession(client, "/mcp", session_id="e" * 32)
        for method in METHODS:
            theirs, none = await _404_data(stranger, method), await _404_data(nobody, method)
            assert theirs["evidence"] == {**none["evidence"], "session": owner.session_id}
            assert theirs == {"verdict": "unknown_session", "evidence": theirs["evidence"]}


async def test_a_call_that_may_have_run_is_not_sent_again_but_raised(
    apps: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    """The session ends while its call runs: the call raises why, once the new session is open."""
    url = apps["sdk"].url
    told = _Told()
    progress: list[float] = []
    running = anyio.Event()

    async def count(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)
        running.set()

    async def call(mcp: ResumingSession) -> BaseException | None:
        try:
            await mcp.call_tool("countdown", {"n": 100, "interval_ms": 50}, progress_callback=count)
        except Exception as exc:
            return exc
        return None

    with anyio.fail_after(30):
        async with ResumingSession(url, on_new_session=told) as mcp:
            first = mcp.session_id
            assert first is not None
            outcome: list[BaseException | None] = []
            async with anyio.create_task_group() as group:
                group.start_soon(lambda: _collect(call(mcp), outcome))
                await running.wait()
                await _kill_with_junk_cursor(http, url, first)
            ended = outcome[0]
            assert isinstance(ended, ResumptionDesyncError), repr(ended)
            assert ended.verdict is Verdict.UNKNOWN_SESSION
            assert ended.__cause__ is not None  # the SDK's own error, kept
            assert len(told.calls) == 1 and told.calls[0][1] is ended
            assert mcp.session_id not in (None, first)
            assert len(progress) < 100  # cut, and not run again
            assert await _countdown(mcp) == "done 2"


async def _collect(result: Any, into: list[Any]) -> None:
    into.append(await result)


async def test_the_watch_takes_any_404_for_a_session_as_its_end_and_counts_requests() -> None:
    """A 404 naming no verdict (a proxy's page) ends the session too; only request POSTs count."""
    watch, url = DesyncWatch(), "http://127.0.0.1:1/mcp"

    def answer(status: int, method: str = "POST", body: Any = None, **headers: str) -> Any:
        request = httpx.Request(method, url, json=body, headers=headers)
        return httpx.Response(status, html="<h1>404</h1>" if status == 404 else "", request=request)

    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
    created = answer(200, body=initialize)
    created.headers["mcp-session-id"] = "s1"
    await watch.hook(created)
    assert watch.session_id == "s1" and (watch.refused, watch.taken) == (0, 0)

    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}
    await watch.hook(answer(200, body=call, **{"mcp-session-id": "s1"}))
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await watch.hook(answer(202, body=note, **{"mcp-session-id": "s1"}))
    assert (watch.refused, watch.taken) == (0, 1)
    assert watch.ended("s1") is None

    await watch.hook(answer(404, body=call, **{"mcp-session-id": "s1"}))
    assert (watch.refused, watch.taken) == (1, 1)
    ended = watch.ended("s1")
    assert ended is not None and ended.verdict is Verdict.UNKNOWN_SESSION
    assert ended.resumption.evidence.session == "s1"
    await watch.hook(answer(404, "DELETE", **{"mcp-session-id": "s1"}))
    assert watch.ended("s1") is ended  # the first 404 is the cause
    assert watch.pop() is ended and watch.pop() is None
    assert watch.ended("s1") is ended and watch.ended("s2") is None


async def test_a_new_session_whose_restore_failed_is_tried_again_by_the_next_call(
    apps: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    url = apps["sdk"].url
    calls: list[ResumptionDesyncError | None] = []

    def restore(session: Any, ended: ResumptionDesyncError | None) -> None:  # a plain function
        calls.append(ended)
        if len(calls) == 1:
            raise LookupError("the state to restore is not there yet")

    with anyio.fail_after(30):
        async with ResumingSession(url, on_new_session=restore) as mcp:
            first = mcp.session_id
            assert first is not None
            await _kill_with_junk_cursor(http, url, first)
            with pytest.raises(LookupError):
                await _countdown(mcp)
            assert await _countdown(mcp, 3) == "done 3"
            assert len(calls) == 2 and all(c is not None for c in calls)
            assert mcp.session_id not in (None, first)

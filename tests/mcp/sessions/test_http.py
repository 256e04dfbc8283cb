"""The MCP integration over real HTTP: SDK example server processes on Redis and memory://.

Cases: (1) SDK client resumes, (2) random drops,
(3) failed resumptions fail closed, (4) session isolation, (5) the
replay-to-live seam, (6) the GET stream while detached, (7) 2026-07-28
clients, (8) FastMCP (``ALSO_ON_FASTMCP``), (9) replicas share verdicts.
"""

from __future__ import annotations

import json
import random
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client

from replaystore import ReplayBuffer, Verdict
from replaystore.cursor import Cursor
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import (
    SSE,
    RawSession,
    ServerProcess,
    metric,
    position,
    progress_of,
    result_text,
    sse_events,
)
from tests.mcp.sessions._support import STREAM_TIMEOUT, first_event_ids

pytestmark = pytest.mark.anyio

#: The scenarios that run on the FastMCP server too (``fastmcp_http_app``, case 8).
ALSO_ON_FASTMCP = pytest.mark.parametrize(
    "sdk", ["sdk-redis", "sdk-memory", "fastmcp"], indirect=True
)

RESUMPTIONS = "replaystore_mcp_resumptions_total"


async def metrics_text(http: httpx.AsyncClient, server: ServerProcess) -> str:
    response = await http.get(f"{server.base}/metrics")
    assert response.status_code == 200
    return response.text


async def sdk_countdown(url: str, arguments: dict[str, Any]) -> tuple[list[float], str]:
    """Call countdown through the SDK's own client; return (progress values, result text)."""
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        with anyio.fail_after(20):
            result = await session.call_tool("countdown", arguments, progress_callback=on_progress)
    assert not result.is_error, result
    text = result.content[0].text  # type: ignore[union-attr]
    return progress, text


# ------------------------------------------------------------------ case 1


@ALSO_ON_FASTMCP
async def test_sdk_client_resumes_after_server_closes_stream(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    before = metric(await metrics_text(http, sdk), RESUMPTIONS, verdict="resumed")
    progress, text = await sdk_countdown(sdk.url, {"n": 20, "interval_ms": 5, "close_after": 5})
    assert progress == [float(i) for i in range(1, 21)]
    assert text == "done 20"
    after = metric(await metrics_text(http, sdk), RESUMPTIONS, verdict="resumed")
    assert after >= before + 1, "the client must have resumed at least once"


# ------------------------------------------------------------------ case 2


async def run_with_random_drops(
    session: RawSession, rng: random.Random, n: int, interval_ms: int
) -> tuple[list[float], list[str], int]:
    """POST countdown, drop the connection at random points, resume with GET + Last-Event-ID."""
    request_id, body = session.call("countdown", {"n": n, "interval_ms": interval_ms}, token="tok")
    progress: list[float] = []
    results: list[str] = []
    ids: list[str] = []

    async def consume(response: httpx.Response, budget: int) -> bool:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        messages = 0
        async for event in sse_events(response):
            if event.id:
                ids.append(event.id)
            value = progress_of(event)
            if value is not None:
                progress.append(value)
            text = result_text(event, request_id)
            if text is not None:
                results.append(text)
                return True
            if event.message is not None:
                messages += 1
            if messages >= budget and ids:
                return False  # drop the connection right here
        return False

    with anyio.fail_after(STREAM_TIMEOUT):  # a lost event would hang the stream: fail instead
        async with session.post(body) as response:
            done = await consume(response, rng.randint(0, 6))
        resumes = 0
        while not done:
            resumes += 1
            assert resumes < 200
            async with session.get(ids[-1]) as response:
                done = await consume(response, rng.randint(0, 8))
    return progress, results, resumes


@ALSO_ON_FASTMCP
async def test_random_drops_are_exactly_once_in_order(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    rng = random.Random(20261114)
    total_resumes = 0
    for run in range(20):
        session = await RawSession(http, sdk.url).initialize()
        n = rng.randint(5, 25)
        progress, results, resumes = await run_with_random_drops(
            session, rng, n, interval_ms=rng.choice([0, 1, 3])
        )
        total_resumes += resumes
        assert progress == [float(i) for i in range(1, n + 1)], f"run {run}"
        assert results == [f"done {n}"], f"run {run}"
    assert total_resumes >= 20


# ------------------------------------------------------------------ case 3


async def expect_fail_closed(session: RawSession, cursor: str, verdict: Verdict) -> dict[str, Any]:
    async with session.get(cursor) as response:
        raw = await response.aread()
        assert response.status_code == 404, raw
        assert response.headers["content-type"].startswith("application/json")
    body = json.loads(raw)
    assert body["jsonrpc"] == "2.0"
    assert body["id"] is None
    assert body["error"]["code"] == -32600
    data = body["error"]["data"]
    assert data["verdict"] == verdict.value, data
    assert data["evidence"]["session"] == session.session_id
    # Torn down in this process: every later request with that session id is 404.
    assert await session.ping_status() == 404
    async with session.get() as response:
        assert response.status_code == 404
    return dict(data["evidence"])


@pytest.mark.parametrize("cursor", ["not-a-cursor", "4471", ""])
@ALSO_ON_FASTMCP
async def test_malformed_cursor_fails_closed(
    sdk: ServerProcess, http: httpx.AsyncClient, cursor: str
) -> None:
    session = await RawSession(http, sdk.url).initialize()
    await first_event_ids(session)
    if cursor == "":
        cursor = "3f9a1c0b7d2e-04471"  # a leading zero: two spellings are never accepted
    await expect_fail_closed(session, cursor, Verdict.MALFORMED_CURSOR)


@ALSO_ON_FASTMCP
async def test_forged_epoch_fails_closed(sdk: ServerProcess, http: httpx.AsyncClient) -> None:
    session = await RawSession(http, sdk.url).initialize()
    ids = await first_event_ids(session)
    forged = f"000000000000-{Cursor.parse(ids[-1]).position}"
    evidence = await expect_fail_closed(session, forged, Verdict.FOREIGN_CURSOR)
    assert evidence["torn_down"] is True


@ALSO_ON_FASTMCP
async def test_ahead_of_high_water_fails_closed(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    session = await RawSession(http, sdk.url).initialize()
    ids = await first_event_ids(session)
    last = Cursor.parse(ids[-1])
    evidence = await expect_fail_closed(
        session, f"{last.epoch}-{last.position + 1000}", Verdict.AHEAD_OF_HIGH_WATER
    )
    assert evidence["high_water"] < last.position + 1000


@ALSO_ON_FASTMCP
async def test_other_sessions_cursor_fails_closed(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    a = await RawSession(http, sdk.url).initialize()
    b = await RawSession(http, sdk.url).initialize()
    a_ids = await first_event_ids(a)
    await first_event_ids(b)
    await expect_fail_closed(b, a_ids[2], Verdict.FOREIGN_CURSOR)
    # The owner of the cursor is untouched.
    assert await a.ping_status() == 200
    assert await a.run_tool("countdown", {"n": 1, "interval_ms": 0}) == "done 1"


async def test_evicted_cursor_fails_closed(
    mcp_servers: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    small = mcp_servers["sdk-small"]
    before = await metrics_text(http, small)
    session = await RawSession(http, small.url).initialize()
    _, body = session.call("countdown", {"n": 5, "interval_ms": 0}, token="t")
    async with session.post(body) as response:
        events = sse_events(response)
        priming = await events.__anext__()
        assert priming.priming and priming.id
        assert priming.retry == 100
    # More events than the session keeps (max_events=12): the priming is evicted.
    assert await session.run_tool("countdown", {"n": 20, "interval_ms": 0}, "u") == "done 20"
    evidence = await expect_fail_closed(session, priming.id, Verdict.BELOW_FLOOR)
    assert evidence["floor"] > position(priming.id)
    after = await metrics_text(http, small)
    assert metric(after, RESUMPTIONS, verdict="below_floor") == (
        metric(before, RESUMPTIONS, verdict="below_floor") + 1
    )


@ALSO_ON_FASTMCP
async def test_failed_verdict_counted_and_timed(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    before = await metrics_text(http, sdk)
    session = await RawSession(http, sdk.url).initialize()
    await expect_fail_closed(session, "garbage", Verdict.MALFORMED_CURSOR)
    after = await metrics_text(http, sdk)
    assert metric(after, RESUMPTIONS, verdict="malformed_cursor") == (
        metric(before, RESUMPTIONS, verdict="malformed_cursor") + 1
    )
    count = "replaystore_mcp_replay_seconds_count"
    assert metric(after, count, outcome="failed") == metric(before, count, outcome="failed") + 1


# ------------------------------------------------------------------ case 4


@ALSO_ON_FASTMCP
async def test_two_sessions_same_stream_names_never_mix(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    a = await RawSession(http, sdk.url).initialize()
    b = await RawSession(http, sdk.url).initialize()
    runs: dict[str, tuple[RawSession, int, list[SSE]]] = {}
    for name, session, n in (("A", a, 4), ("B", b, 7)):
        session.next_id = 5  # both sessions use request id 5: the SDK's stream "5"
        request_id, body = session.call(
            "countdown", {"n": n, "interval_ms": 5, "close_after": 1}, token=name
        )
        assert request_id == 5
        async with session.post(body) as response:
            runs[name] = (session, n, [event async for event in sse_events(response)])
    for name, (session, n, events) in runs.items():
        cursor = [e.id for e in events if e.id][-1]
        with anyio.fail_after(STREAM_TIMEOUT):
            async with session.get(cursor) as response:
                assert response.status_code == 200
                async for event in sse_events(response):
                    events.append(event)
                    if result_text(event, 5) is not None:
                        break
        tokens = {
            e.message["params"]["progressToken"]
            for e in events
            if e.message and e.message.get("method") == "notifications/progress"
        }
        assert tokens == {name}
        assert [progress_of(e) for e in events if progress_of(e) is not None] == [
            float(i) for i in range(1, n + 1)
        ]
        assert [result_text(e, 5) for e in events if result_text(e, 5)] == [f"done {n}"]
    # The standalone GET stream ("_GET_stream" in both sessions) is not shared either.
    assert await a.run_tool("broadcast", {"n": 3}) == "sent 3"
    b_events = await read_for(b, 0.4)
    assert [e for e in b_events if not e.priming] == []
    a_events = await read_for(a, 0.4)
    assert log_texts(a_events) == ["broadcast 1/3", "broadcast 2/3", "broadcast 3/3"]


# ------------------------------------------------------------------ case 5


@ALSO_ON_FASTMCP
async def test_seam_sdk_client_fast_producer(sdk: ServerProcess) -> None:
    progress, text = await sdk_countdown(sdk.url, {"n": 300, "interval_ms": 1, "close_after": 1})
    assert progress == [float(i) for i in range(1, 301)]
    assert text == "done 300"


async def test_seam_immediate_resume_while_producing(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    """Resume with no delay while the tool is still producing: nothing lost, nothing twice."""
    for n in (50, 200, 400):
        session = await RawSession(http, sdk.url).initialize()
        request_id, body = session.call(
            "countdown", {"n": n, "interval_ms": 0, "close_after": 1}, token="t"
        )
        seen = Seen(request_id)
        with anyio.fail_after(STREAM_TIMEOUT):
            async with session.post(body) as response:
                async for event in sse_events(response):
                    seen.take(event)
            assert 1 <= len(seen.ids) <= 2  # priming (+ the first progress), then closed
            while not seen.results:
                async with session.get(seen.ids[-1]) as response:
                    assert response.status_code == 200
                    async for event in sse_events(response):
                        seen.take(event)
        assert seen.progress == [float(i) for i in range(1, n + 1)]
        assert seen.results == [f"done {n}"]
        positions = [position(i) for i in seen.ids]
        assert positions == sorted(set(positions)), "ids strictly increasing on the wire"


class Seen:
    """What a client saw of one request's stream, across connections."""

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.ids: list[str] = []
        self.progress: list[float] = []
        self.results: list[str] = []

    def take(self, event: SSE) -> None:
        if event.id:
            self.ids.append(event.id)
        if (value := progress_of(event)) is not None:
            self.progress.append(value)
        if (text := result_text(event, self.request_id)) is not None:
            self.results.append(text)


@ALSO_ON_FASTMCP
async def test_takeover_of_a_live_stream(sdk: ServerProcess, http: httpx.AsyncClient) -> None:
    """Resuming a stream still live on connection A: B takes over, A is closed, no event twice."""
    session = await RawSession(http, sdk.url).initialize()
    n = 40
    request_id, body = session.call("countdown", {"n": n, "interval_ms": 15}, token="t")
    a_events: list[SSE] = []
    b_events: list[SSE] = []
    async with session.post(body) as a:
        a_stream = sse_events(a)
        async for event in a_stream:
            a_events.append(event)
            if progress_of(event) == 5.0:
                break
        cursor = a_events[-1].id
        assert cursor is not None
        async with session.get(cursor) as b:
            assert b.status_code == 200
            with anyio.fail_after(10):
                async for event in sse_events(b):
                    b_events.append(event)
                    if result_text(event, request_id) is not None:
                        break
        # A must have been closed by the takeover (else it would run to the result).
        with anyio.fail_after(5):
            async for event in a_stream:
                a_events.append(event)
    b_progress = [progress_of(e) for e in b_events if progress_of(e) is not None]
    assert b_progress == [float(i) for i in range(6, n + 1)]
    assert [result_text(e, request_id) for e in b_events if result_text(e, request_id)] == [
        f"done {n}"
    ]
    assert all(result_text(e, request_id) is None for e in a_events), "A got the result too"
    cut = position(cursor)
    a_after = {e.id for e in a_events if e.id and position(e.id) > cut}
    b_ids = {e.id for e in b_events if e.id}
    assert a_after <= b_ids, "A only got events that B replayed (sent before the takeover)"
    a_last = max(position(e.id) for e in a_events if e.id)
    b_live = [position(e.id) for e in b_events if e.id and position(e.id) > a_last]
    assert len(b_live) >= 10, "most of the stream went to B only"


# ------------------------------------------------------------------ case 6


def log_texts(events: list[SSE]) -> list[str]:
    return [
        str(e.message["params"]["data"])
        for e in events
        if e.message and e.message.get("method") == "notifications/message"
    ]


async def read_for(session: RawSession, seconds: float) -> list[SSE]:
    """Open a plain GET and collect what arrives within ``seconds``."""
    events: list[SSE] = []
    async with session.get() as response:
        assert response.status_code == 200, await response.aread()
        with anyio.move_on_after(seconds):
            async for event in sse_events(response):
                events.append(event)
    return events


@ALSO_ON_FASTMCP
async def test_get_events_stored_while_detached_reach_next_get(
    sdk: ServerProcess, http: httpx.AsyncClient
) -> None:
    session = await RawSession(http, sdk.url).initialize()
    # No GET attached yet: the messages are stored for the session.
    assert await session.run_tool("broadcast", {"n": 5}) == "sent 5"
    first = await read_for(session, 0.4)
    assert log_texts(first) == [f"broadcast {i}/5" for i in range(1, 6)]
    assert first[-1].priming and first[-1].retry == 100, "priming right after the replay"
    ids = [position(e.id) for e in first if e.id]
    assert ids == sorted(ids)
    # Detached again: only what was missed since, nothing twice.
    assert await session.run_tool("broadcast", {"n": 3}) == "sent 3"
    second = await read_for(session, 0.4)
    assert log_texts(second) == [f"broadcast {i}/3" for i in range(1, 4)]
    # Nothing missed: the GET starts with a priming event, and live messages follow.
    events: list[SSE] = []
    async with session.get() as response:
        stream = sse_events(response)
        events.append(await stream.__anext__())
        assert events[0].priming and events[0].id
        assert await session.run_tool("broadcast", {"n": 2}) == "sent 2"
        with anyio.move_on_after(0.4):
            async for event in stream:
                events.append(event)
    assert log_texts(events) == ["broadcast 1/2", "broadcast 2/2"]
    # The GET stream resumes with Last-Event-ID like any other.
    async with session.get(events[0].id) as response:
        replayed: list[SSE] = []
        with anyio.move_on_after(0.4):
            async for event in sse_events(response):
                replayed.append(event)
    assert log_texts(replayed) == ["broadcast 1/2", "broadcast 2/2"]


async def test_sdk_client_receives_broadcasts(sdk: ServerProcess) -> None:
    received: list[str] = []
    all_four = anyio.Event()

    async def on_log(params: Any) -> None:
        received.append(str(params.data))
        if len(received) == 4:
            all_four.set()

    async with (
        streamable_http_client(sdk.url) as (read, write),
        ClientSession(read, write, logging_callback=on_log) as session,
    ):
        await session.initialize()
        result = await session.call_tool("broadcast", {"n": 4})
        assert result.content[0].text == "sent 4"  # type: ignore[union-attr]
        with anyio.fail_after(5):
            await all_four.wait()
    assert received == [f"broadcast {i}/4" for i in range(1, 5)]


async def test_get_events_evicted_while_detached_fail_closed(
    mcp_servers: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    session = await RawSession(http, mcp_servers["sdk-small"].url).initialize()
    assert await session.run_tool("broadcast", {"n": 30}) == "sent 30"
    async with session.get() as response:
        body = json.loads(await response.aread())
        assert response.status_code == 404
    assert body["error"]["data"]["verdict"] == "below_floor"
    assert await session.ping_status() == 404


# ------------------------------------------------------------------ case 7


async def test_2026_clients_keep_working(sdk: ServerProcess) -> None:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with Client(sdk.url) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool(
            "countdown", {"n": 3, "interval_ms": 0}, progress_callback=on_progress
        )
    assert result.content[0].text == "done 3"  # type: ignore[union-attr]
    assert progress == [1.0, 2.0, 3.0]


async def test_legacy_mode_client_on_same_server(sdk: ServerProcess) -> None:
    async with Client(sdk.url, mode="legacy") as client:
        assert client.protocol_version == "2025-11-25"
        result = await client.call_tool("countdown", {"n": 2, "interval_ms": 0})
    assert result.content[0].text == "done 2"  # type: ignore[union-attr]


# ------------------------------------------------------------------ case 9


async def test_replicas_share_the_store_verdict(
    mcp_servers: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    one, two = mcp_servers["sdk-redis"], mcp_servers["sdk-replica"]
    assert one.store_url == two.store_url
    session = await RawSession(http, one.url).initialize()
    ids = await first_event_ids(session)
    url, _, query = one.store_url.partition("?")
    prefix = query.removeprefix("prefix=")
    async with ReplayBuffer.from_url(url, prefix=prefix) as buffer:
        # The store session is the real Mcp-Session-Id: any process sharing the
        # storage resolves the server's cursors the same way.
        probe = await buffer.resolve(session.session_id, ids[1])
        assert probe.verdict is Verdict.RESUMED
        assert probe.sequence == "1"
        await expect_fail_closed(session, "000000000000-1", Verdict.FOREIGN_CURSOR)
        after = await buffer.resolve(session.session_id, ids[1])
    assert after.verdict is Verdict.UNKNOWN_SESSION
    assert after.evidence.tombstone is not None
    assert after.evidence.tombstone.verdict is Verdict.FOREIGN_CURSOR
    # The other replica refuses the session as well, whatever the cursor.
    other = RawSession(http, two.url, session_id=session.session_id)
    async with other.get(ids[1]) as response:
        assert response.status_code == 404
    assert await other.ping_status() == 404


async def test_session_end_closes_the_store_session(
    mcp_servers: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    server = mcp_servers["sdk-redis"]
    session = await RawSession(http, server.url).initialize()
    ids = await first_event_ids(session)
    response = await http.delete(server.url, headers=session.headers())
    assert response.status_code == 200
    url, _, query = server.store_url.partition("?")
    async with ReplayBuffer.from_url(url, prefix=query.removeprefix("prefix=")) as buffer:
        gone = await buffer.resolve(session.session_id, ids[1])
    assert gone.verdict is Verdict.UNKNOWN_SESSION
    assert gone.evidence.tombstone is not None and gone.evidence.tombstone.verdict is None


# ------------------------------------------------------------------ storage down


async def test_storage_down_gives_503_not_200(
    mcp_servers: dict[str, ServerProcess],
    doomed_redis: ServerHandle,
    http: httpx.AsyncClient,
) -> None:
    server = mcp_servers["sdk-doomed"]
    session = await RawSession(http, server.url).initialize()
    ids = await first_event_ids(session)
    doomed_redis.stop()
    async with session.get(ids[1]) as response:
        raw = await response.aread()
        assert response.status_code == 503, raw
    body = json.loads(raw)
    assert body["error"]["data"]["reason"] == "storage_error"
    assert response.headers["retry-after"] == "1"
    text = (await http.get(f"{server.base}/metrics")).text
    assert metric(text, RESUMPTIONS, verdict="storage_error") == 1


async def test_sdk_client_gets_an_error_not_a_hang_when_its_cursor_is_evicted(
    mcp_servers: dict[str, ServerProcess], http: httpx.AsyncClient
) -> None:
    """The SDK client looped forever on the stock empty 200; on our 404 it gives up and says so.

    The cursor is evicted before the client comes back, whatever the speed of
    the tool or of the server stack: the client's first resume waits until 20
    more events of its session are stored (the session keeps 12). Left to the
    race between the tool's appends and the client's 100 ms reconnect, a slow
    tool let the client resume in time and read ``done 200``.
    """
    url = mcp_servers["sdk-small"].url
    evicted: list[str] = []

    async def evict_first(request: httpx2.Request) -> None:
        cursor = request.headers.get("last-event-id")
        if request.method != "GET" or cursor is None or evicted:
            return
        same = RawSession(http, url, session_id=request.headers["mcp-session-id"], next_id=1000)
        assert await same.run_tool("countdown", {"n": 20, "interval_ms": 0}, "evict") == "done 20"
        evicted.append(cursor)

    async def ignore_progress(value: float, total: float | None, message: str | None) -> None:
        pass

    client = httpx2.AsyncClient(
        timeout=httpx2.Timeout(30.0, read=300.0), event_hooks={"request": [evict_first]}
    )
    async with (
        client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        with anyio.fail_after(15):
            try:
                result = await session.call_tool(
                    "countdown",
                    {"n": 200, "interval_ms": 0, "close_after": 1},
                    progress_callback=ignore_progress,
                )
            except Exception as exc:  # the SDK raises MCPError for the abandoned request
                message = str(exc)
            else:
                assert result.is_error, result
                message = str(result.content)
        assert evicted, "the stream was not closed after its first event: no resume"
        assert "reconnection attempts were exhausted" in message or "terminated" in message
        with anyio.fail_after(15), pytest.raises(Exception, match=r"(?i)session|not found|404"):
            await session.send_ping()

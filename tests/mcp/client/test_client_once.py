"""The client helper never hands an event to the application twice, even on a stale Last-Event-ID.

The SDK's client, when a reconnection fails, tries again with the id it
started from, and the server (rightly) replays everything after that id. The
transport of :mod:`replaystore.mcp.client.once` (used by ``DesyncWatch`` and
``ResumingSession``) knows what it passed on per stream and drops the rest.
Played here by hand against the real example server: a stream cut after three
progress notifications, resumed from the first one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx2
import pytest

from replaystore.mcp.client.once import OncePerStream
from replaystore.mcp.client.resuming import DesyncWatch
from replaystore.mcp.example import build_app
from replaystore.testing.mcp import initialize_message
from replaystore.testing.sse import sse_events
from tests.mcp._support import PV, progress_of, result_text, served_in_loop

pytestmark = pytest.mark.anyio


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with served_in_loop(build_app("memory://once")) as port:
        yield f"http://127.0.0.1:{port}/mcp"


async def _session(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": PV}
    init = initialize_message()
    async with http.stream("POST", url, json=init, headers=headers) as response:
        assert response.status_code == 200
        headers["mcp-session-id"] = response.headers["mcp-session-id"]
        await response.aread()
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=note, headers=headers)).status_code == 202
    return headers


async def _stale_resume(
    http: httpx2.AsyncClient, url: str
) -> tuple[list[float], list[float], str | None]:
    """A countdown cut after 3 progress, resumed from the FIRST progress's id.

    Returns what arrived before the cut (the third may be lost with the
    connection), what arrived in all, and the result.
    """
    headers = await _session(http, url)
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {
            "name": "countdown",
            "arguments": {"n": 6, "interval_ms": 20, "close_after": 3},
            "_meta": {"progressToken": "p"},
        },
    }
    progress: list[float] = []
    first = None
    async with http.stream("POST", url, json=call, headers=headers) as response:
        async for event in sse_events(response):  # type: ignore[arg-type]
            if (value := progress_of(event)) is not None:
                progress.append(value)
                first = first or event.id
    before = list(progress)
    assert before[:2] == [1.0, 2.0] and first
    result = None
    get = {**headers, "accept": "text/event-stream", "last-event-id": first}
    with anyio.fail_after(15):
        async with http.stream("GET", url, headers=get) as response:
            assert response.status_code == 200
            async for event in sse_events(response):  # type: ignore[arg-type]
                if (value := progress_of(event)) is not None:
                    progress.append(value)
                if (text := result_text(event, 7)) is not None:
                    result = text
                    break
    return before, progress, result


async def test_a_stale_last_event_id_hands_no_duplicate_to_the_application(url: str) -> None:
    async with DesyncWatch().client_factory() as http:
        _, progress, result = await _stale_resume(http, url)
    assert progress == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert result == "done 6"


async def test_without_it_the_server_replays_what_the_client_asked_for(url: str) -> None:
    """The control: the same exchange on a plain client repeats 2 and 3 (the server is right)."""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30.0)) as http:
        before, progress, result = await _stale_resume(http, url)
    assert progress == [*before, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert result == "done 6"


async def test_separate_streams_keep_separate_memories(url: str) -> None:
    """Event ids repeat across streams of a session: two calls each get all their events."""
    async with httpx2.AsyncClient(transport=OncePerStream(), timeout=30.0) as http:
        headers = await _session(http, url)
        for request_id in (1, 2):
            call = {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": {
                    "name": "countdown",
                    "arguments": {"n": 3, "interval_ms": 0},
                    "_meta": {"progressToken": request_id},
                },
            }
            progress = []
            async with http.stream("POST", url, json=call, headers=headers) as response:
                async for event in sse_events(response):  # type: ignore[arg-type]
                    if (value := progress_of(event)) is not None:
                        progress.append(value)
            assert progress == [1.0, 2.0, 3.0]

"""Case 8: the same guarantees through FastMCP 4 (``fastmcp_http_app``), on a real Redis.

The scenarios are the SDK ones from ``test_http.py``, run against a FastMCP
server process whose tools mirror the SDK example's.
"""

from __future__ import annotations

import httpx
import pytest

import tests.mcp.test_http as sdk_cases
from replaystore import Verdict
from tests.mcp._support import RawSession, ServerProcess

pytestmark = pytest.mark.anyio


@pytest.fixture
def fastmcp(mcp_servers: dict[str, ServerProcess]) -> ServerProcess:
    return mcp_servers["fastmcp"]


async def test_fastmcp_sdk_client_resumes(fastmcp: ServerProcess, http: httpx.AsyncClient) -> None:
    await sdk_cases.test_sdk_client_resumes_after_server_closes_stream(fastmcp, http)


async def test_fastmcp_random_drops(fastmcp: ServerProcess, http: httpx.AsyncClient) -> None:
    await sdk_cases.test_random_drops_are_exactly_once_in_order(fastmcp, http)


async def test_fastmcp_forged_and_foreign_cursors_fail_closed(
    fastmcp: ServerProcess, http: httpx.AsyncClient
) -> None:
    await sdk_cases.test_malformed_cursor_fails_closed(fastmcp, http, "not-a-cursor")
    await sdk_cases.test_forged_epoch_fails_closed(fastmcp, http)
    await sdk_cases.test_ahead_of_high_water_fails_closed(fastmcp, http)
    await sdk_cases.test_other_sessions_cursor_fails_closed(fastmcp, http)


async def test_fastmcp_failed_resumption_counted(
    fastmcp: ServerProcess, http: httpx.AsyncClient
) -> None:
    await sdk_cases.test_failed_verdict_counted_and_timed(fastmcp, http)


async def test_fastmcp_sessions_never_mix(fastmcp: ServerProcess, http: httpx.AsyncClient) -> None:
    await sdk_cases.test_two_sessions_same_stream_names_never_mix(fastmcp, http)


async def test_fastmcp_seam_and_takeover(fastmcp: ServerProcess, http: httpx.AsyncClient) -> None:
    await sdk_cases.test_seam_sdk_client_fast_producer(fastmcp)
    await sdk_cases.test_takeover_of_a_live_stream(fastmcp, http)


async def test_fastmcp_get_stream_kept_while_detached(
    fastmcp: ServerProcess, http: httpx.AsyncClient
) -> None:
    await sdk_cases.test_get_events_stored_while_detached_reach_next_get(fastmcp, http)


async def test_fastmcp_store_is_keyed_by_the_real_session_id(
    fastmcp: ServerProcess, http: httpx.AsyncClient
) -> None:
    """FastMCP's own wrapper keys streams by a random id; ours by the real Mcp-Session-Id."""
    from replaystore import ReplayBuffer

    session = await RawSession(http, fastmcp.url).initialize()
    ids = await sdk_cases.first_event_ids(session)
    url, _, query = fastmcp.store_url.partition("?")
    async with ReplayBuffer.from_url(url, prefix=query.removeprefix("prefix=")) as buffer:
        probe = await buffer.resolve(session.session_id, ids[1])
    assert probe.verdict is Verdict.RESUMED
    assert probe.sequence == "1"

"""Case 8: the same guarantees through FastMCP 4 (``fastmcp_http_app``), on a real Redis.

The SDK scenarios run against a FastMCP server process whose tools mirror the
SDK example's where they are written (``ALSO_ON_FASTMCP`` in
``tests/mcp/sessions/test_http.py``); what only FastMCP needs checked is here.
"""

from __future__ import annotations

import httpx
import pytest

from replaystore import Verdict
from tests.mcp._support import RawSession, ServerProcess
from tests.mcp.sessions._support import first_event_ids

pytestmark = pytest.mark.anyio


@pytest.fixture
def fastmcp(mcp_servers: dict[str, ServerProcess]) -> ServerProcess:
    return mcp_servers["fastmcp"]


async def test_fastmcp_store_is_keyed_by_the_real_session_id(
    fastmcp: ServerProcess, http: httpx.AsyncClient
) -> None:
    """FastMCP's own wrapper keys streams by a random id; ours by the real Mcp-Session-Id."""
    from replaystore import ReplayBuffer

    session = await RawSession(http, fastmcp.url).initialize()
    ids = await first_event_ids(session)
    url, _, query = fastmcp.store_url.partition("?")
    async with ReplayBuffer.from_url(url, prefix=query.removeprefix("prefix=")) as buffer:
        probe = await buffer.resolve(session.session_id, ids[1])
    assert probe.verdict is Verdict.RESUMED
    assert probe.sequence == "1"

"""What the session tests over HTTP share, on the SDK and on FastMCP servers alike."""

from __future__ import annotations

import anyio

from tests.mcp._support import RawSession, result_text, sse_events

#: Seconds a stream may take to reach its result: a lost event shows up as a hang.
STREAM_TIMEOUT = 15


async def first_event_ids(session: RawSession, n: int = 3) -> list[str]:
    """Run a countdown to completion and return the ids it carried."""
    request_id, body = session.call("countdown", {"n": n, "interval_ms": 0}, token="t")
    ids: list[str] = []
    with anyio.fail_after(STREAM_TIMEOUT):
        async with session.post(body) as response:
            async for event in sse_events(response):
                if event.id:
                    ids.append(event.id)
                if result_text(event, request_id) is not None:
                    break
    assert len(ids) == n + 2  # priming, n progress, result
    return ids

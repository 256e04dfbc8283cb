"""A FastMCP app as a user writes it from ``docs/mcp.md``, run by plain uvicorn.

``uvicorn tests.mcp.user_fastmcp_app:app``: nothing but the documented
wiring, no drain, signal or collector code of its own. ``REPLAYSTORE_URL``
names the store its replicas share.
"""

import os

import anyio
from fastmcp import Context, FastMCP

from replaystore import ReplayBuffer
from replaystore.mcp import fastmcp_http_app

mcp = FastMCP("demo")


@mcp.tool
async def countdown(ctx: Context, n: int, interval: float) -> str:
    """``n`` progress notifications, ``interval`` seconds apart, then the result."""
    for i in range(n):
        await anyio.sleep(interval)
        await ctx.report_progress(i + 1, n)
    return f"done {n}"


app = fastmcp_http_app(
    mcp, ReplayBuffer.from_url(os.environ["REPLAYSTORE_URL"]), retry_interval=1000
)

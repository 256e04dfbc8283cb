"""An app as a user writes it from ``docs/mcp.md``: ``uvicorn tests.mcp.user_sdk_app:app``.

Nothing but the documented wiring: no drain, signal or collector code of
its own. ``REPLAYSTORE_URL`` names the store its replicas share.
"""

import os

import anyio
from mcp.server.mcpserver import Context, MCPServer

from replaystore import ReplayBuffer
from replaystore.mcp import streamable_http_app

mcp = MCPServer("demo")


@mcp.tool()
async def countdown(ctx: Context, n: int, interval: float) -> str:
    """``n`` progress notifications, ``interval`` seconds apart, then the result."""
    for i in range(n):
        await anyio.sleep(interval)
        await ctx.report_progress(i + 1, n)
    return f"done {n}"


app = streamable_http_app(
    mcp, ReplayBuffer.from_url(os.environ["REPLAYSTORE_URL"]), retry_interval=1000
)

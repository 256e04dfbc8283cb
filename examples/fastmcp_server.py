"""FastMCP 4 server whose SSE streams survive reconnects: ``python examples/fastmcp_server.py``.

Set ``REPLAYSTORE_URL=redis://localhost:6379/0`` to share the store between
replicas; the default ``memory://`` keeps it in this process. Processes on one
store URL are replicas of each other: start several (``PORT=8001``,
``PORT=8002`` …) and put any load balancer in front of them, no sticky
sessions needed (see ``docs/deployment.md``).
"""

import os

import uvicorn
from fastmcp import Context, FastMCP

from replaystore import ReplayBuffer
from replaystore.mcp import fastmcp_http_app

mcp = FastMCP("demo")


@mcp.tool
async def countdown(ctx: Context, n: int) -> str:
    for i in range(n):
        await ctx.report_progress(i + 1, n)
    return f"done {n}"


buffer = ReplayBuffer.from_url(os.environ.get("REPLAYSTORE_URL", "memory://"))
app = fastmcp_http_app(mcp, buffer, retry_interval=1000)  # MCP at /mcp

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))

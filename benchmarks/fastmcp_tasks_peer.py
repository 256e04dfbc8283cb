"""A FastMCP + ``fastmcp-tasks`` server for ``benchmarks.tasks``, run from its own venv.

``fastmcp-tasks`` pins another FastMCP than replaystore's, so this file imports
nothing from replaystore and runs as ``<venv>/bin/python fastmcp_tasks_peer.py
PORT REDIS_URL`` in a virtual environment that has ``fastmcp-tasks`` installed.
"""

from __future__ import annotations

import asyncio
import sys


def main() -> None:
    import uvicorn
    from fastmcp import FastMCP
    from fastmcp_tasks import TasksExtension

    port, url = int(sys.argv[1]), sys.argv[2]
    mcp = FastMCP("peer")
    mcp.add_extension(TasksExtension(url=url, name="bench"))

    @mcp.tool(task=True)
    async def countdown(n: int, interval_ms: int = 10) -> str:
        for _ in range(n):
            await asyncio.sleep(interval_ms / 1000)
        return f"counted {n}"

    uvicorn.run(mcp.http_app(path="/mcp"), host="127.0.0.1", port=port, log_level="error")


if __name__ == "__main__":
    main()

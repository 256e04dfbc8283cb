"""A FastMCP + ``fastmcp-tasks`` server for ``benchmarks.tasks``, run from its own venv.

``fastmcp-tasks`` pins another FastMCP than replaystore's, so this file imports
nothing from replaystore and runs as ``<venv>/bin/python fastmcp_tasks_peer.py
PORT REDIS_URL`` in a virtual environment that has ``fastmcp-tasks`` installed.

Its tools match ``benchmarks.tasks_server``'s: ``countdown`` and ``survey``.
``fastmcp-tasks`` rejects ``ctx.elicit`` inside a task, so ``survey`` asks in
its guard style instead: each round returns an ``InputRequiredResult`` and the
next round runs once the client answered it through ``tasks/update``. (No
``from __future__ import annotations``: the tools' annotations name types
imported inside ``main``, which FastMCP could not resolve from strings.)
"""

import asyncio
import sys


def main() -> None:
    import uvicorn
    from fastmcp import Context, FastMCP
    from fastmcp_tasks import TasksExtension
    from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult

    port, url = int(sys.argv[1]), sys.argv[2]
    mcp = FastMCP("peer")
    mcp.add_extension(TasksExtension(url=url, name="bench"))

    @mcp.tool(task=True)
    async def countdown(n: int, interval_ms: int = 10) -> str:
        for _ in range(n):
            await asyncio.sleep(interval_ms / 1000)
        return f"done {n}"

    @mcp.tool(task=True)
    async def survey(ctx: Context, rounds: int = 1) -> str | InputRequiredResult:
        asked = int(ctx.request_state or 0)
        if asked >= rounds:
            return f"answered {asked}"
        schema = {"type": "object", "properties": {"name": {"type": "string"}}}
        params = ElicitRequestFormParams(message=f"question {asked + 1}", requested_schema=schema)
        return InputRequiredResult(
            input_requests={f"q{asked + 1}": ElicitRequest(params=params)},
            request_state=str(asked + 1),
        )

    uvicorn.run(mcp.http_app(path="/mcp"), host="127.0.0.1", port=port, log_level="error")


if __name__ == "__main__":
    main()

"""A 2025-11-25 server loads nothing of the 2026-07-28 tasks stack.

An application that only serves sessions pays neither the import time nor
the memory of the tasks extension and its task store. Checked in a fresh
interpreter, where ``sys.modules`` tells exactly what was loaded: an app is
built and its lifespan run (the replica joins its store and leaves it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

TASK_PACKAGES = (
    "replaystore.mcp.tasks",
    "replaystore.taskstore",
    "replaystore.backends.memory.tasks",
    "replaystore.backends.redis.coordination.tasks",
)

_SCRIPT = textwrap.dedent(
    """
    import json, sys

    import anyio

    from replaystore import ReplayBuffer

    WITH_TASKS = sys.argv[1] == "tasks"
    FASTMCP = sys.argv[2] == "fastmcp"
    kw = {}
    if WITH_TASKS:
        from replaystore.mcp.tasks import ReplayTasks

        kw["tasks"] = ReplayTasks({"work": "optional"})
    buffer = ReplayBuffer.from_url("memory://revisions")
    if FASTMCP:
        from fastmcp import FastMCP

        from replaystore.mcp import fastmcp_http_app

        server = FastMCP("revisions")
    else:
        from mcp.server.mcpserver import MCPServer

        from replaystore.mcp import streamable_http_app

        server = MCPServer("revisions", extensions=list(kw.values()))

    async def work() -> str:
        return "done"

    server.tool()(work)
    if FASTMCP:
        app = fastmcp_http_app(server, buffer, **kw)
    else:
        app = streamable_http_app(server, buffer, **kw)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            pass

    anyio.run(main)
    print(json.dumps(sorted(sys.modules)))
    """
)


def _loaded(mode: str, server: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode, server],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return modules


def _task_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "replaystore.taskstore" or m.startswith(TASK_PACKAGES)]


@pytest.mark.parametrize("server", ["sdk", "fastmcp"])
def test_a_2025_app_loads_no_task_module(server: str) -> None:
    """Neither on the SDK's ``MCPServer`` nor on FastMCP (which serves listen streams too)."""
    modules = _loaded("sessions", server)
    assert "replaystore.mcp.sessions.manager" in modules  # the app was built and run
    assert _task_modules(modules) == []


@pytest.mark.parametrize("server", ["sdk", "fastmcp"])
def test_an_app_given_tasks_loads_them(server: str) -> None:
    """The check above sees the tasks stack when it is loaded."""
    found = _task_modules(_loaded("tasks", server))
    assert "replaystore.mcp.tasks.extension" in found
    assert "replaystore.backends.memory.tasks" in found

"""The example server's tools on FastMCP 4, served through ``fastmcp_http_app``.

Run as ``python -m tests.mcp.fastmcp_app --port P --url URL --max-events N``; with
``--lease-seconds S`` (and ``--task-ttl``), ``countdown`` and ``ask`` also run as
durable tasks for 2026-07-28 clients that declare the extension.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import uvicorn
from fastmcp import Context, FastMCP
from mcp_types import SamplingMessage, TextContent
from pydantic import BaseModel

from replaystore import ReplayBuffer
from replaystore.mcp import fastmcp_http_app, http_protocol
from replaystore.mcp.subscriptions import StoreSubscriptionBus
from replaystore.mcp.tasks.extension import ReplayTasks, TaskSupport


class _Name(BaseModel):
    name: str


def build_app(
    url: str = "memory://", max_events: int = 10_000, tasks: ReplayTasks | None = None
) -> Any:
    mcp = FastMCP("replaystore-fastmcp-example")

    @mcp.tool
    async def countdown(ctx: Context, n: int, interval_ms: int = 10, close_after: int = 0) -> str:
        for i in range(n):
            await ctx.report_progress(i + 1, n, f"{n - i - 1} left")
            if close_after and i + 1 == close_after:
                await ctx.close_sse_stream()
            if interval_ms > 0:
                await anyio.sleep(interval_ms / 1000)
        return f"done {n}"

    @mcp.tool
    async def broadcast(ctx: Context, n: int) -> str:
        for i in range(n):
            await ctx.session.send_log_message("info", f"broadcast {i + 1}/{n}")
        return f"sent {n}"

    @mcp.tool
    async def ask(ctx: Context, question: str = "What is your name?") -> str:
        answer = await ctx.elicit(question, _Name)
        if answer.action == "accept":
            return f"hello {answer.data.name}"  # type: ignore[union-attr]
        return f"no answer ({answer.action})"

    @mcp.tool
    async def greet(ctx: Context) -> str:
        """Asks for a name (elicitation) and for a greeting (sampling) at once."""
        found: dict[str, str] = {}

        async def name() -> None:
            answer = await ctx.elicit("Who?", _Name)
            found["name"] = answer.data.name if answer.action == "accept" else answer.action  # type: ignore[union-attr]

        async def greeting() -> None:
            prompt = SamplingMessage(role="user", content=TextContent(type="text", text="Greet"))
            sampled = await ctx.session.create_message([prompt], max_tokens=16)
            found["greeting"] = sampled.content.text  # type: ignore[union-attr]

        async with anyio.create_task_group() as group:
            group.start_soon(name)
            group.start_soon(greeting)
        return f"{found['greeting']} {found['name']}"

    @mcp.tool
    async def hold(seconds: float) -> str:
        await anyio.sleep(seconds)
        return f"held {seconds}"

    buffer = ReplayBuffer.from_url(url, max_events=max_events)
    bus = StoreSubscriptionBus() if tasks is not None else None
    return fastmcp_http_app(
        mcp,
        buffer,
        retry_interval=100,
        metrics_path="/metrics",
        tasks=tasks,
        subscriptions=bus,
    )


def example_tasks(lease: float, ttl: float) -> ReplayTasks:
    """``countdown`` (idempotent), ``ask``, ``greet``, ``hold``: tasks for clients asking so."""
    return ReplayTasks(
        {
            "countdown": TaskSupport("optional", idempotent=True),
            "ask": "optional",
            "greet": "optional",
            "hold": "optional",
        },
        ttl=ttl,
        lease=lease,
        check_interval=min(0.25, lease / 4),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--url", default="memory://")
    parser.add_argument("--max-events", type=int, default=10_000)
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--lease-seconds", type=float, default=0.0)
    parser.add_argument("--task-ttl", type=float, default=3600.0)
    args = parser.parse_args()
    tasks = example_tasks(args.lease_seconds, args.task_ttl) if args.lease_seconds else None
    app = build_app(args.url, args.max_events, tasks)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, http=http_protocol())


if __name__ == "__main__":
    main()

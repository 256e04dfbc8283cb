"""A listen stream whose replica missed events ends with an error saying so: real Redis, real HTTP.

One app (``MCPServer`` wired by ``streamable_http_app``) served by uvicorn
on a loopback port, its listen bus reading a real Redis through a TCP proxy.
The proxy stops forwarding (the bus reader stalls) while another replica
publishes more events than the store keeps; once it forwards again, the
replica knows what it missed: the client's listen stream ends with a
JSON-RPC error naming the loss (so it listens and lists again), and the
count and the log line stay.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import ToolsListChanged

from replaystore import ReplayBuffer
from replaystore.mcp import streamable_http_app
from replaystore.mcp.subscriptions import EVENTS_LOST, StoreSubscriptionBus
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle, find_free_port

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _listen_body() -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"notifications": {"toolsListChanged": True}, "_meta": meta}
    return {"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": params}


async def test_a_listener_whose_replica_missed_events_sees_its_stream_end(
    mcp_redis: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"gaps-{uuid.uuid4().hex[:8]}:"
    host, port = mcp_redis.url.split("//")[1].split("/")[0].split(":")
    keep = 10
    received: list[dict[str, Any]] = []
    acknowledged = anyio.Event()
    with TcpProxy([(host, int(port))]) as proxy:
        async with (
            ReplayBuffer.from_url(mcp_redis.url, prefix=prefix) as direct,
            ReplayBuffer.from_url(proxy.url(), prefix=prefix) as stalling,
        ):
            bus = StoreSubscriptionBus(keep=keep, block=0.2)
            bus.bind(stalling)  # this replica reads its listen events through the proxy
            app = streamable_http_app(MCPServer("gaps"), direct, subscriptions=bus)
            other = StoreSubscriptionBus(keep=keep, block=0.2)  # another replica
            other.bind(direct)
            web_port = find_free_port()
            config = uvicorn.Config(app, host="127.0.0.1", port=web_port, log_level="error")
            server = uvicorn.Server(config)

            async def listen(http: httpx.AsyncClient) -> None:
                headers = {
                    "Accept": "application/json, text/event-stream",
                    "MCP-Protocol-Version": MODERN,
                    "Mcp-Method": "subscriptions/listen",
                }
                url = f"http://127.0.0.1:{web_port}/mcp"
                async with http.stream("POST", url, json=_listen_body(), headers=headers) as reply:
                    assert reply.status_code == 200
                    async for line in reply.aiter_lines():
                        if line.startswith("data:"):
                            message = json.loads(line[5:])
                            received.append(message)
                            if message.get("method") == "notifications/subscriptions/acknowledged":
                                acknowledged.set()

            with caplog.at_level(logging.WARNING, logger="replaystore.mcp.subscriptions"):
                async with anyio.create_task_group() as group:
                    group.start_soon(server.serve)
                    with anyio.fail_after(20):
                        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event
                            await anyio.sleep(0.02)
                    async with httpx.AsyncClient(timeout=30) as http:
                        ended = anyio.Event()

                        async def follow() -> None:
                            await listen(http)
                            ended.set()

                        group.start_soon(follow)
                        with anyio.fail_after(10):
                            await acknowledged.wait()
                        proxy.pause()  # the reader stalls
                        for _ in range(300):  # far more than the store keeps
                            await other.publish(ToolsListChanged())
                        proxy.resume()
                        with anyio.fail_after(15):
                            await ended.wait()
                    server.should_exit = True
    errors = [m for m in received if "error" in m]
    assert len(errors) == 1 and received[-1] is errors[0], received[-3:]
    error = errors[0]["error"]
    assert error["data"]["reason"] == EVENTS_LOST, error
    assert error["data"]["missed"] == bus.gaps > 0, (error, bus.gaps)
    assert any("trimmed before this replica read them" in r.getMessage() for r in caplog.records)

"""What replicas share with the default wiring: two real processes on one real Redis.

Each replica is ``examples/conformance_server.py``, built with
``streamable_http_app(server, buffer, tasks=tasks)`` and nothing else: no
request-state key and no listen bus passed. A client that sends each
request of a 2026-07-28 exchange to another replica must see what it would
see on one process: a ``requestState`` sealed by one replica opens on the
other, a listen stream on one replica gets a list change published on the
other. In-process checks of the wiring's rules (what is kept, what is
replaced, the opt-out) follow.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastmcp import FastMCP
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import InvalidRequestState, RequestStateSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus

from replaystore import ReplayBuffer
from replaystore.mcp import fastmcp_http_app, streamable_http_app
from replaystore.mcp.request_state import REPEATED, StoreKeyRing
from replaystore.mcp.subscriptions import StoreSubscriptionBus
from replaystore.testing.servers import ServerHandle, find_free_port
from tests.mcp._support import ServerProcess, _popen, wait_ready

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def replicas(
    mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    """Two conformance-server processes on one Redis and one fresh key prefix."""
    logs: Path = tmp_path_factory.mktemp("shared-by-default")
    url = f"{mcp_redis.url}?prefix=shared-{uuid.uuid4().hex[:8]}:"
    servers = []
    for name in ("a", "b"):
        port = find_free_port()
        log = logs / f"{name}.log"
        args = ["examples/conformance_server.py", "--port", str(port), "--url", url]
        servers.append(ServerProcess(name, port, _popen(args, log), log, url))
    try:
        wait_ready(servers)
        yield servers
    finally:
        for server in servers:
            server.stop()


def _body(method: str, params: dict[str, Any], *, extension: bool = False) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"elicitation": {}, "sampling": {}}
    if extension:
        capabilities["extensions"] = {"io.modelcontextprotocol/tasks": {}}
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    return {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {**params, "_meta": meta},
    }


def _headers(method: str, name: str = "") -> dict[str, str]:
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    if name:
        headers["Mcp-Name"] = name
    return headers


async def _call(
    client: httpx.AsyncClient, url: str, tool: str, arguments: dict[str, Any], **params: Any
) -> dict[str, Any]:
    body = _body("tools/call", {"name": tool, "arguments": arguments, **params})
    response = await client.post(url, json=body, headers=_headers("tools/call", tool))
    return _message(response.text)


def _message(text: str) -> dict[str, Any]:
    """The JSON-RPC response in a JSON or SSE body."""
    if text.lstrip().startswith("{"):
        reply: dict[str, Any] = json.loads(text)
        return reply
    for line in text.splitlines():
        if line.startswith("data:") and '"id"' in line:
            found: dict[str, Any] = json.loads(line[5:])
            if "result" in found or "error" in found:
                return found
    raise AssertionError(f"no response in {text[:300]!r}")


def _accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


async def test_a_request_state_sealed_by_one_replica_opens_on_the_other(
    replicas: list[ServerProcess],
) -> None:
    a, b = replicas
    async with httpx.AsyncClient(timeout=10) as client:
        tool = "test_input_required_result_request_state"
        first = (await _call(client, a.url, tool, {}))["result"]
        assert first["resultType"] == "input_required"
        state = first["requestState"]
        assert state != "request-state-nonce"  # sealed, not the plaintext
        second = await _call(
            client,
            b.url,
            tool,
            {},
            inputResponses={"confirm": _accept(ok=True)},
            requestState=state,
        )
        assert second["result"]["content"][0]["text"] == "state-ok: confirmation received"

        # Three rounds, each on another replica than the one before.
        tool = "test_input_required_result_multi_round"
        round1 = (await _call(client, b.url, tool, {}))["result"]
        round2 = (
            await _call(
                client,
                a.url,
                tool,
                {},
                inputResponses={"step1": _accept(name="Ada")},
                requestState=round1["requestState"],
            )
        )["result"]
        assert round2["resultType"] == "input_required"
        done = await _call(
            client,
            b.url,
            tool,
            {},
            inputResponses={"step2": _accept(color="green")},
            requestState=round2["requestState"],
        )
        assert done["result"]["content"][0]["text"] == "Ada likes green."


async def test_a_round_sent_four_times_across_replicas_runs_once(
    replicas: list[ServerProcess],
) -> None:
    """A balancer's or client's retry of round 2 never runs the tool's second round again:
    the first copy runs, every other, on either replica, gets its answer again, marked."""
    a, b = replicas
    async with httpx.AsyncClient(timeout=10) as client:
        tool = "test_input_required_result_request_state"
        state = (await _call(client, a.url, tool, {}))["result"]["requestState"]
        replies = [
            await _call(
                client,
                (a, b)[i % 2].url,
                tool,
                {},
                inputResponses={"confirm": _accept(ok=True)},
                requestState=state,
            )
            for i in range(4)
        ]
    results = [reply["result"] for reply in replies]
    ran = [r for r in results if REPEATED not in r.get("_meta", {})]
    assert len(ran) == 1 and results[0] is ran[0], results
    assert ran[0]["content"][0]["text"] == "state-ok: confirmation received"
    for again in results[1:]:
        assert again["_meta"][REPEATED] is True, again
        assert {k: v for k, v in again.items() if k != "_meta"} == {
            k: v for k, v in ran[0].items() if k != "_meta"
        }


async def test_a_tampered_request_state_is_refused_on_every_replica(
    replicas: list[ServerProcess],
) -> None:
    a, b = replicas
    async with httpx.AsyncClient(timeout=10) as client:
        tool = "test_input_required_result_tampered_state"
        state = (await _call(client, a.url, tool, {}))["result"]["requestState"]
        tampered = state[:-2] + ("AA" if state[-2:] != "AA" else "BB")
        reply = await _call(
            client,
            b.url,
            tool,
            {},
            inputResponses={"confirm": _accept(ok=True)},
            requestState=tampered,
        )
        assert reply["error"]["code"] == -32602


async def test_a_listen_stream_on_one_replica_sees_a_list_change_made_on_the_other(
    replicas: list[ServerProcess],
) -> None:
    a, b = replicas
    received: list[dict[str, Any]] = []
    acknowledged = anyio.Event()
    changed = anyio.Event()

    async def listen(client: httpx.AsyncClient) -> None:
        body = _body("subscriptions/listen", {"notifications": {"toolsListChanged": True}})
        headers = _headers("subscriptions/listen")
        async with client.stream("POST", b.url, json=body, headers=headers) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                received.append(message)
                if message.get("method") == "notifications/subscriptions/acknowledged":
                    acknowledged.set()
                if message.get("method") == "notifications/tools/list_changed":
                    changed.set()
                    return

    async with httpx.AsyncClient(timeout=10) as client, anyio.create_task_group() as group:
        group.start_soon(listen, client)
        with anyio.fail_after(10):
            await acknowledged.wait()
        reply = await _call(client, a.url, "test_trigger_tool_change", {})
        assert reply["result"]["content"][0]["text"] == "tool list changed"
        with anyio.fail_after(10):
            await changed.wait()
        group.cancel_scope.cancel()
    assert [m["method"] for m in received][-1] == "notifications/tools/list_changed"


# -- the wiring's rules, in process ---------------------------------------------------------


def _boundary_security(server: Any) -> Any:
    from mcp.server.request_state import RequestStateBoundary

    lowlevel = getattr(server, "_lowlevel_server", None) or server._mcp_server
    found = [m for m in lowlevel.middleware if isinstance(m, RequestStateBoundary)]
    assert len(found) == 1
    return found[0]._security


def test_the_default_policy_is_replaced_by_the_store_key_and_the_default_bus_by_the_store() -> None:
    server = MCPServer("shared-demo")
    before = _boundary_security(server)
    app = streamable_http_app(server, ReplayBuffer.from_url("memory://"))
    shared = app.state.replaystore
    assert isinstance(shared.key_ring, StoreKeyRing)
    assert _boundary_security(server) is shared.request_state
    assert shared.request_state.ttl == before.ttl
    assert isinstance(shared.subscriptions, StoreSubscriptionBus)
    assert server._subscriptions is shared.subscriptions  # what ctx.notify_* publishes to


def test_share_false_keeps_the_servers_own_policy_and_bus() -> None:
    server = MCPServer("private-demo")
    before = _boundary_security(server)
    app = streamable_http_app(server, ReplayBuffer.from_url("memory://"), share=False)
    shared = app.state.replaystore
    assert shared.key_ring is None
    assert _boundary_security(server) is before
    assert isinstance(shared.subscriptions, InMemorySubscriptionBus)


def test_each_round_is_accepted_once_unless_the_app_opts_out() -> None:
    from mcp.server.request_state import RequestStateBoundary

    from replaystore.mcp.request_state import SingleUseBoundary

    def boundary(**options: Any) -> Any:
        server = MCPServer("once-demo")
        streamable_http_app(server, ReplayBuffer.from_url("memory://"), **options)
        middleware = server._lowlevel_server.middleware
        (found,) = [m for m in middleware if isinstance(m, RequestStateBoundary)]
        return found

    assert isinstance(boundary(), SingleUseBoundary)
    given = RequestStateSecurity(keys=["k" * 32])
    assert isinstance(boundary(request_state=given), SingleUseBoundary)  # your policy too
    for options in ({"request_state_once": False}, {"share": False}):
        assert not isinstance(boundary(**options), SingleUseBoundary), options


def test_share_false_on_a_shared_store_says_what_it_costs(
    mcp_redis: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """A per-process key with a store other processes share is never accepted silently."""
    server = MCPServer("private-redis-demo")
    with caplog.at_level("WARNING", logger="replaystore.mcp"):
        streamable_http_app(server, ReplayBuffer.from_url(mcp_redis.url), share=False)
    assert "Invalid or expired requestState" in caplog.text


def test_a_policy_given_to_the_app_wins() -> None:
    mine = RequestStateSecurity(keys=[b"k" * 32])
    server = MCPServer("own-key-demo")
    app = streamable_http_app(server, ReplayBuffer.from_url("memory://"), request_state=mine)
    assert app.state.replaystore.key_ring is None
    assert _boundary_security(server) is mine


def test_a_codec_of_the_applications_own_is_kept() -> None:
    class Codec:
        def seal(self, payload: bytes) -> str:
            return payload.decode()

        def unseal(self, token: str) -> bytes:
            return token.encode()

    mine = RequestStateSecurity(codec=Codec())
    server = MCPServer("own-codec-demo", request_state_security=mine)
    app = streamable_http_app(server, ReplayBuffer.from_url("memory://"))
    assert app.state.replaystore.key_ring is None
    assert _boundary_security(server) is mine


def test_on_fastmcp_a_servers_own_policy_is_kept_and_the_default_replaced() -> None:
    mine = RequestStateSecurity(keys=[b"f" * 32])
    own = FastMCP("own-fast", request_state_security=mine)
    app = fastmcp_http_app(own, ReplayBuffer.from_url("memory://"))
    assert app.state.replaystore.key_ring is None
    assert _boundary_security(own) is mine

    default = FastMCP("default-fast")
    app = fastmcp_http_app(default, ReplayBuffer.from_url("memory://"))
    shared = app.state.replaystore
    assert isinstance(shared.key_ring, StoreKeyRing)
    assert _boundary_security(default) is shared.request_state
    assert isinstance(shared.subscriptions, StoreSubscriptionBus)


async def test_key_rings_on_one_store_seal_and_open_each_others_tokens() -> None:
    buffer = ReplayBuffer.from_url(f"memory://ring-{uuid.uuid4().hex[:8]}")
    first, second = StoreKeyRing(), StoreKeyRing()
    with pytest.raises(RuntimeError, match="not loaded"):
        first.seal(b"early")
    with pytest.raises(InvalidRequestState):
        first.unseal("v1.anything")
    for ring in (first, second):
        ring.bind(buffer)
        await ring.load()
    assert second.unseal(first.seal(b"state")) == b"state"
    assert first.unseal(second.seal(b"other")) == b"other"


async def test_a_key_ring_keeps_opening_tokens_of_a_key_the_store_lost(
    mcp_redis: ServerHandle,
) -> None:
    """The store restarted empty: the ring takes the new key and still opens older tokens."""
    import redis.asyncio

    prefix = f"ring-{uuid.uuid4().hex[:8]}:"
    buffer = ReplayBuffer.from_url(f"{mcp_redis.url}?prefix={prefix}")
    async with buffer:
        ring = StoreKeyRing()
        ring.bind(buffer)
        await ring.load()
        old = ring.seal(b"before")
        client = redis.asyncio.Redis.from_url(mcp_redis.url)
        try:
            key = f"{prefix}{{request-state}}:key"
            assert await client.exists(key) == 1
            await client.set(key, "x" * 64)  # another replica re-created it meanwhile
            await ring.load()
            assert ring.unseal(old) == b"before"
            new = ring.seal(b"after")
            fresh = StoreKeyRing()
            fresh.bind(buffer)
            await fresh.load()
            assert fresh.unseal(new) == b"after"
        finally:
            await client.aclose()

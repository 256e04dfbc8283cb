"""``replaystore bench storm --http``: the storm end to end, on the MCP wire.

R ``replaystore example-server`` replicas share one Redis. Every session is a
real MCP session (protocol 2025-11-25) driven over HTTP with the SDK's wire
format: ``initialize``, then a ``countdown`` tool call whose SSE stream the
server closes after a few progress notifications. Then the storm: every client
reconnects at once with ``GET`` + ``Last-Event-ID`` and reads to the call's
result. Each client's progress notifications, over both connections, are
judged against what the tool sent: all of them, once each, in order.

Mixed in at the stated rate: a client presenting another session's cursor
(``foreign``) and one presenting an id no replica issued (``ahead``); the only
correct answer to both is a failure (404).

Routing: :data:`ROUTING`. ``round-robin`` sends every request (a new TCP
connection each) through a round-robin TCP proxy, so a resume usually lands on
another replica than the one running the call. ``sticky`` sends each client to
one replica chosen by its index, as a session-affine balancer would.

The clients run in this process (asyncio, ``concurrency`` at once); on a
small machine they, not the servers, may set the pace.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..cursor import Cursor
from ..testing.example_servers import ExampleServers
from ..testing.proxy import TcpProxy
from ..testing.sse import sse_events
from .progress import Bar
from .stores import Reply
from .truth import Tally
from .workload import Reconnect

__all__ = ["ROUTING", "run_http_storm"]

ROUTING = "round-robin"
"""``"round-robin"`` (any replica serves any session) or ``"sticky"`` (session-affine)."""

PROTOCOL = "2025-11-25"
NOTIFICATIONS = 8  # progress notifications per tool call
CLOSE_AFTER = 3  # the server closes the call's stream after this many
_TIMEOUT = 30.0


@dataclass
class _Client:
    index: int
    base: str
    session_id: str = ""
    progress: list[int] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    results: int = 0
    last_event_id: str | None = None

    def headers(self, **extra: str) -> dict[str, str]:
        h = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": PROTOCOL,
        }
        if self.session_id:
            h["mcp-session-id"] = self.session_id
        h.update(extra)
        return h


async def _events(response: httpx.Response) -> AsyncIterator[tuple[str | None, str]]:
    """``(id, data)`` of each SSE event."""
    async for event in sse_events(response):
        yield event.id, event.data


def _take(client: _Client, event_id: str | None, data: str) -> None:
    """Record one SSE event of the tool call's stream."""
    if event_id:
        client.last_event_id = event_id
    if not data:
        return  # a priming event
    message = json.loads(data)
    if message.get("method") == "notifications/progress":
        params = message["params"]
        client.tokens.add(str(params.get("progressToken")))
        client.progress.append(int(params["progress"]))
    elif message.get("id") == 1 and "result" in message:
        client.results += 1


async def _setup(http: httpx.AsyncClient, client: _Client) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "replaystore-bench", "version": "0"},
        },
    }
    async with http.stream("POST", client.base, json=init, headers=client.headers()) as r:
        if r.status_code != 200:
            raise RuntimeError(f"initialize: HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        client.session_id = r.headers["mcp-session-id"]
        await r.aread()
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    r2 = await http.post(client.base, json=note, headers=client.headers())
    if r2.status_code != 202:
        raise RuntimeError(f"initialized: HTTP {r2.status_code}: {r2.text[:200]}")
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "countdown",
            "arguments": {"n": NOTIFICATIONS, "interval_ms": 0, "close_after": CLOSE_AFTER},
            "_meta": {"progressToken": f"t{client.index}"},
        },
    }
    async with http.stream("POST", client.base, json=call, headers=client.headers()) as r:
        if r.status_code != 200:
            raise RuntimeError(f"tools/call: HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for event_id, data in _events(r):
            _take(client, event_id, data)


async def _resume(http: httpx.AsyncClient, client: _Client, cursor: str) -> Reply:
    headers = client.headers(accept="text/event-stream", **{"last-event-id": cursor})
    headers.pop("content-type")
    async with http.stream("GET", client.base, headers=headers) as r:
        if r.status_code == 404:
            body = (await r.aread()).decode(errors="replace")
            try:
                verdict = str(json.loads(body)["error"]["data"]["verdict"])
            except (ValueError, KeyError, TypeError):
                verdict = "404"
            return Reply(None, True, verdict)
        if r.status_code != 200:
            return Reply(None, True, f"http_{r.status_code}")
        before = len(client.progress)
        async for event_id, data in _events(r):
            _take(client, event_id, data)
            if client.results:
                break
        return Reply([str(p) for p in client.progress[before:]], False, "resumed")


def _judge(client: _Client, reconnect: Reconnect, reply: Reply) -> str:
    possible = reconnect.kind == "normal"
    if reply.failed:
        return "incorrect_failure" if possible else "correct_failure"
    if client.tokens - {f"t{client.index}"}:
        return "wrong_stream"
    if len(set(client.progress)) != len(client.progress):
        return "duplicate"
    if not possible or client.progress != list(range(1, NOTIFICATIONS + 1)) or client.results != 1:
        return "loss"
    return "exact"


def run_http_storm(
    url: str,
    *,
    sessions: int,
    replicas: int,
    concurrency: int,
    pathology_rate: float,
    seed: int,
    progress: bool,
) -> dict[str, Any]:
    """Start the replicas (and the proxy), run the storm over HTTP, stop everything."""
    with ExampleServers(replicas, url) as servers, TcpProxy(servers.addresses) as proxy:
        bases = [f"http://{h}:{p}/mcp" for h, p in servers.addresses]
        front = f"http://{proxy.host}:{proxy.port}/mcp"
        return asyncio.run(
            _storm(
                bases,
                front,
                sessions=sessions,
                concurrency=concurrency,
                pathology_rate=pathology_rate,
                seed=seed,
                progress=progress,
            )
        )


async def _bounded(jobs: list[Any], concurrency: int) -> None:
    it = iter(jobs)

    async def work() -> None:
        for job in it:
            await job

    try:
        await asyncio.gather(*(work() for _ in range(max(1, min(concurrency, len(jobs))))))
    finally:
        for job in it:  # interrupted: jobs never started are closed, not left to warn
            job.close()


async def _storm(
    bases: list[str],
    front: str,
    *,
    sessions: int,
    concurrency: int,
    pathology_rate: float,
    seed: int,
    progress: bool,
) -> dict[str, Any]:
    rng = random.Random(seed)
    route = (lambda i: front) if ROUTING == "round-robin" else (lambda i: bases[i % len(bases)])
    clients = [_Client(i, route(i)) for i in range(sessions)]
    # A new TCP connection per request, so a round-robin proxy spreads every request.
    limits = httpx.Limits(max_keepalive_connections=0, max_connections=concurrency * 2)
    async with httpx.AsyncClient(limits=limits, timeout=_TIMEOUT) as http:
        with Bar(enabled=progress) as bar:
            began = time.monotonic()
            with bar.task("http: sessions", sessions) as advance:

                async def setup(c: _Client) -> None:
                    await _setup(http, c)
                    advance(1)

                await _bounded([setup(c) for c in clients], concurrency)
            setup_s = time.monotonic() - began

            n_bad = round(sessions * pathology_rate / 2) if pathology_rate > 0 else 0
            order = list(range(sessions))
            rng.shuffle(order)
            kinds = ["foreign"] * n_bad + ["ahead"] * n_bad
            kinds += ["normal"] * (sessions - len(kinds))
            plan: list[tuple[_Client, Reconnect]] = []
            for i, kind in zip(order, kinds, strict=True):
                c = clients[i]
                cursor = c.last_event_id or ""
                if kind == "foreign":
                    cursor = clients[(i + 1) % sessions].last_event_id or ""
                elif kind == "ahead":
                    parsed = Cursor.try_parse(cursor)
                    if parsed is not None:
                        cursor = f"{parsed.epoch}-{parsed.position + 1000}"
                plan.append((c, Reconnect(i, kind, c.session_id, "1", cursor, 0, 0)))

            tally = Tally()
            latencies: list[float] = []
            with bar.task("http: storm", len(plan)) as advance:

                async def resume(c: _Client, r: Reconnect) -> None:
                    t0 = time.monotonic()
                    reply = await _resume(http, c, r.cursor)
                    latencies.append(time.monotonic() - t0)
                    outcome = _judge(c, r, reply)
                    tally.add(r, reply, outcome, possible=r.kind == "normal")
                    advance(1)

                t0 = time.monotonic()
                await _bounded([resume(c, r) for c, r in plan], concurrency)
                wall = time.monotonic() - t0

    lat = sorted(latencies)

    def q(x: float) -> float:
        return round(lat[min(len(lat) - 1, int(x * len(lat)))] * 1e3, 3)

    return {
        "name": f"replaystore-http ({ROUTING})",
        "what": f"replaystore example-server replicas, MCP over HTTP, {ROUTING} routing",
        "routing": ROUTING,
        "resumes": len(lat),
        "resumes_per_s": round(len(lat) / wall, 1) if wall > 0 else None,
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "p999_ms": q(0.999),
        "appends": sessions * (NOTIFICATIONS + 1),
        "appends_per_s": None,
        "setup_seconds": round(setup_s, 2),
        **tally.as_dict(),
        "latency_cdf_ms": [q(i / 100) for i in range(101)],
        "resume_by_history": {},
    }

"""``replaystore bench storm --http``: the storm end to end, on the MCP wire, store against store.

Every store runs behind R server replicas, the way its users deploy it:

- ``replaystore`` (round robin): ``replaystore example-server`` replicas on one
  Redis behind a round-robin TCP proxy, a new TCP connection per request, so a
  resume usually lands on another replica than the one that ran the call;
- ``replaystore`` (sticky): the same replicas, each client sent back to one;
- ``sdk-example`` (sticky): the official SDK with its example's in-memory
  event store (:mod:`.peers`);
- ``fastmcp`` (sticky): FastMCP 4 with its event store on Redis;
- ``floor`` (sticky): the least a Python server can do for the same
  requests (:mod:`.floor`: bare ASGI, one ``LRANGE`` per resume), the
  yardstick of every other row's replica CPU per resume.

Sticky routing is the client choosing its replica by its own index, as a
session-affine balancer would by session; when that replica is down it goes
to the next live one, as a balancer's health check would.

Every session is a real MCP session (protocol 2025-11-25) driven over HTTP by
hand (:class:`~replaystore.testing.mcp.RawSession`)
with the SDK's wire format: ``initialize``, then a ``countdown`` tool call whose
SSE stream the server closes after a few progress notifications. Then the
storm: every client reconnects at once with ``GET`` + ``Last-Event-ID`` and
reads to the call's result, retrying when its connection breaks. Each
client's progress notifications, over every connection, are judged against
what the tool sent: all of them, once each, in order. Every client calls the
tool with a request id of its own, as distinct clients of one server would, so
a store that names a call's stream by its request id keeps one stream per
call, and every store replays the same events. Mixed in at the stated
rate: a client presenting another session's cursor (``foreign``) and one
presenting an id no replica issued (``ahead``); the only correct answer to
both is a failure (404).

``kill_replica``: half-way through the storm replica 0 is killed (SIGKILL). A
store that keeps sessions in process memory cannot resume that replica's
sessions anywhere; the correct answer for them is then a 404, and a silent
empty stream is a loss.

Each replica's CPU time over the storm is read from ``/proc`` (the scheduler's count),
so the server's cost per resume, store layer included, is comparable across
stores; the Redis's own CPU is read from ``INFO`` for the stores on Redis.
The clients run in this process (asyncio, ``concurrency`` at once); on a small
machine they, not the servers, may set the pace.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx

from ..cursor import Cursor
from ..testing.mcp import RawSession, Refused
from ..testing.proxy import TcpProxy
from ..testing.servers import find_free_port
from ..testing.sse import SSE, sse_events
from .report import Bar
from .servers import HOST, Servers
from .stores import HTTP_STORES, HttpStore, RedisProbe, Reply
from .truth import Tally, over_rounds
from .worker import bounded
from .workload import Reconnect

__all__ = [
    "HttpRun",
    "run_http_storm",
    "store_servers",
    "with_prefix",
    "without_prefix",
]

NOTIFICATIONS = 8  # progress notifications per tool call
CLOSE_AFTER = 3  # the server closes the call's stream after this many
_TIMEOUT = 30.0
_IDLE = 3.0  # a resume whose stream stays silent this long is over (what it got is judged)
_RETRY_FOR = 20.0  # a client retries a broken connection for this long


@dataclass
class _Client:
    index: int
    home: int  # the replica a sticky balancer sends it to
    session_id: str = ""
    progress: list[int] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    results: int = 0
    last_event_id: str | None = None

    @property
    def call_id(self) -> int:
        """Its tool call's JSON-RPC id: its own (``initialize`` is 0 for everyone)."""
        return self.index + 1

    def session(self, http: httpx.AsyncClient, base: str) -> RawSession:
        """Its MCP session, its next request sent to ``base``."""
        return RawSession(http, base, self.session_id, next_id=self.call_id)


class _Routes:
    """Where a client's next request goes: the proxy, or its replica (the next live one)."""

    def __init__(self, bases: list[str], front: str | None) -> None:
        self._bases = bases
        self._front = front
        self.live = list(range(len(bases)))

    def base(self, client: _Client) -> str:
        if self._front is not None:
            return self._front
        n = len(self._bases)
        k = client.home
        while k not in self.live:
            k = (k + 1) % n
        return self._bases[k]


def _take(client: _Client, event: SSE) -> None:
    """Record one SSE event of the tool call's stream."""
    if event.id:
        client.last_event_id = event.id
    message = event.message
    if message is None:
        return  # a priming event
    if message.get("method") == "notifications/progress":
        params = message["params"]
        client.tokens.add(str(params.get("progressToken")))
        client.progress.append(int(params["progress"]))
    elif message.get("id") == client.call_id and "result" in message:
        client.results += 1


#: How many times a client starts its session over after a 503 during setup.
_SETUP_ATTEMPTS = 5


class _Busy(Exception):
    """A replica answered 503 (load shed or store slow) during a client's setup."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _refusal(refused: Refused) -> Exception:
    if refused.status != 503:
        return RuntimeError(str(refused))
    try:
        retry_after = min(5.0, float(refused.retry_after or "1"))
    except ValueError:
        retry_after = 1.0
    return _Busy(str(refused), retry_after)


async def _setup(http: httpx.AsyncClient, client: _Client, base: str) -> None:
    session = client.session(http, base)
    arguments = {"n": NOTIFICATIONS, "interval_ms": 0, "close_after": CLOSE_AFTER}
    try:
        await session.initialize()
        client.session_id = session.session_id
        events = await session.run("countdown", arguments, token=f"t{client.index}")
    except Refused as refused:
        raise _refusal(refused) from None
    for event in events:
        _take(client, event)


async def _resume_once(http: httpx.AsyncClient, client: _Client, base: str, cursor: str) -> Reply:
    async with client.session(http, base).get(cursor) as r:
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
        try:
            async for event in sse_events(r):
                _take(client, event)
                if client.results:
                    break
        except httpx.ReadTimeout:  # a stream that stays open with nothing more in it
            return Reply([str(p) for p in client.progress[before:]], False, "silent")
        verdict = "resumed" if client.results else "ended_without_result"
        return Reply([str(p) for p in client.progress[before:]], False, verdict)


async def _resume(
    http: httpx.AsyncClient, client: _Client, routes: _Routes, cursor: str
) -> tuple[Reply, int, float]:
    """Resume until answered, reconnecting with the newest id after a broken connection.

    Returns the answer, the attempts it took and when the answered attempt began.
    """
    deadline = time.monotonic() + _RETRY_FOR
    attempts = 0
    while True:
        attempts += 1
        began = time.monotonic()
        try:
            reply = await _resume_once(http, client, routes.base(client), cursor)
            return reply, attempts, began
        except httpx.TransportError:
            if time.monotonic() > deadline:
                return Reply(None, True, "unreachable"), attempts, began
            cursor = client.last_event_id or cursor
            await asyncio.sleep(0.05)


def _judge(client: _Client, reconnect: Reconnect, reply: Reply, possible: bool) -> str:
    if reply.failed:
        return "incorrect_failure" if possible else "correct_failure"
    if client.tokens - {f"t{client.index}"}:
        return "wrong_stream"
    if len(set(client.progress)) != len(client.progress):
        return "duplicate"
    if not possible or client.progress != list(range(1, NOTIFICATIONS + 1)) or client.results != 1:
        return "loss"
    return "exact"


def with_prefix(url: str, prefix: str) -> str:
    """``url`` with its ``prefix`` query parameter set to ``prefix``."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "prefix"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("prefix", prefix)])))


def without_prefix(url: str) -> str:
    """``url`` without a ``prefix`` query parameter (what a plain Redis client takes)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "prefix"]
    return urlunsplit(parts._replace(query=urlencode(query)))


def store_servers(store: HttpStore, count: int, url: str, prefix: str) -> Servers:
    """``count`` server replicas of ``store`` on free loopback ports, keys under ``prefix``."""
    commands = []
    for _ in range(count):
        port = find_free_port()
        if store.server == "replaystore":
            argv = [
                sys.executable, "-m", "replaystore", "example-server", "--host", HOST,
                "--port", str(port), "--url", with_prefix(url, prefix),
                "--log-level", "error",
            ]  # fmt: skip
        else:
            entry = ["floor"] if store.server == "floor" else ["peers", store.server]
            argv = [
                sys.executable, "-m", f"replaystore.bench.{entry[0]}", *entry[1:],
                "--host", HOST, "--port", str(port), "--url", without_prefix(url),
                "--prefix", prefix,
            ]  # fmt: skip
        commands.append((argv, [port]))
    return Servers(commands, logs=Path(tempfile.mkdtemp(prefix="replaystore-bench-http-")))


@dataclass(frozen=True, slots=True)
class HttpRun:
    """What every storm of one run shares, whatever the store and the round."""

    url: str
    sessions: int
    replicas: int
    concurrency: int
    pathology_rate: float
    seed: int
    kill_replica: bool = False


def run_http_storm(
    run: HttpRun, *, stores: list[str], prefix: str, rounds: int = 1, progress: bool = False
) -> list[dict[str, Any]]:
    """Every selected store ``rounds`` times, the stores' order rotated each round; a row each.

    Each storm has server processes of its own, started for it and stopped
    after it, so no store inherits another's warm replicas and no round its
    predecessor's. Whatever a store kept in the Redis is under ``prefix``
    (deleted by the caller). A row holds the medians over the rounds and the
    counts summed (:func:`over_rounds`).
    """
    chosen = [s for s in HTTP_STORES if not stores or s.store in stores]
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in chosen}
    with Bar(enabled=progress) as bar:
        for n in range(rounds):
            turn = n % len(chosen)
            for order, store in enumerate(chosen[turn:] + chosen[:turn]):
                row = _on_servers(store, run, f"{prefix}{n}:{store.server}:", bar)
                runs[store.name].append({**row, "order_in_round": order})
    return [over_rounds(runs[s.name]) for s in chosen]


def _on_servers(store: HttpStore, run: HttpRun, prefix: str, bar: Bar) -> dict[str, Any]:
    """One storm of ``store`` on replicas started for it (behind a proxy unless sticky)."""
    with store_servers(store, run.replicas, run.url, prefix) as servers:
        proxy = None if store.sticky else TcpProxy(servers.addresses).start()
        try:
            bases = [f"http://{h}:{p}/mcp" for h, p in servers.addresses]
            front = None if proxy is None else f"http://{proxy.host}:{proxy.port}/mcp"
            return asyncio.run(_storm(store, servers, _Routes(bases, front), proxy, run, bar))
        finally:
            if proxy is not None:
                proxy.stop()


def _plan(clients: list[_Client], rng: random.Random, rate: float) -> list[Reconnect]:
    n = len(clients)
    n_bad = round(n * rate / 2) if rate > 0 else 0
    order = list(range(n))
    rng.shuffle(order)
    kinds = ["foreign"] * n_bad + ["ahead"] * n_bad
    kinds += ["normal"] * (n - len(kinds))
    plan = []
    for i, kind in zip(order, kinds, strict=True):
        c = clients[i]
        cursor = c.last_event_id or ""
        if kind == "foreign":
            cursor = clients[(i + 1) % n].last_event_id or ""
        elif kind == "ahead":
            parsed = Cursor.try_parse(cursor)
            # An id of the store's own form that no replica issued: a later
            # position for replaystore, a fresh uuid for the peers.
            cursor = (
                str(uuid.uuid4()) if parsed is None else f"{parsed.epoch}-{parsed.position + 1000}"
            )
        plan.append(Reconnect(i, kind, c.session_id, "1", cursor, 0, 0))
    return plan


async def _storm(
    store: HttpStore,
    servers: Servers,
    routes: _Routes,
    proxy: TcpProxy | None,
    run: HttpRun,
    bar: Bar,
) -> dict[str, Any]:
    """One store's storm: open the sessions, plan the reconnects, run them, make its row."""
    rng = random.Random(run.seed)
    replicas = len(servers.ports)
    clients = [_Client(i, i % replicas) for i in range(run.sessions)]
    probe = RedisProbe(without_prefix(run.url)) if store.redis else None
    # A new TCP connection per request, so a round-robin proxy spreads every request.
    limits = httpx.Limits(max_keepalive_connections=0, max_connections=run.concurrency * 2)
    timeout = httpx.Timeout(_TIMEOUT, read=_IDLE)
    try:
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
            began = time.monotonic()
            with bar.task(f"{store.name}: sessions", run.sessions) as advance:
                busy = await _open_sessions(http, clients, routes, run.concurrency, advance)
            setup_s = time.monotonic() - began
            plan = _plan(clients, rng, run.pathology_rate)
            resumes = _Resumes(
                store, servers, routes, proxy, len(plan), run.kill_replica and replicas > 1
            )
            with bar.task(f"{store.name}: storm", len(plan)) as advance:
                pairs = [(clients[r.id], r) for r in plan]
                await resumes.run(http, pairs, probe, run.concurrency, advance)
    finally:
        if probe is not None:
            await probe.aclose()
    return _row(
        store,
        resumes.tally,
        resumes.latencies,
        wall=resumes.wall,
        setup_s=setup_s,
        attempts=resumes.attempts,
        cpu=resumes.cpu(),
        redis_cost=resumes.redis_cost,
        killed=resumes.killed,
        sessions=run.sessions,
        setup_retries=busy,
    )


async def _open_sessions(
    http: httpx.AsyncClient,
    clients: list[_Client],
    routes: _Routes,
    concurrency: int,
    advance: Callable[[int], None],
) -> int:
    """Every client's session and tool call, ``concurrency`` at once; the 503s retried.

    A replica that sheds load answers 503 with Retry-After: the client starts
    over with a new session, as a real client does, a few times before the run
    gives up. Returns how many sessions were started over.
    """
    busy = 0

    async def setup(c: _Client) -> None:
        nonlocal busy
        for attempt in range(_SETUP_ATTEMPTS):
            try:
                await _setup(http, c, routes.base(c))
                break
            except _Busy as exc:
                if attempt == _SETUP_ATTEMPTS - 1:
                    raise RuntimeError(str(exc)) from None
                busy += 1
                fresh = _Client(c.index, c.home)
                c.session_id, c.progress, c.tokens = "", fresh.progress, fresh.tokens
                c.results, c.last_event_id = 0, None
                await asyncio.sleep(exc.retry_after)
        advance(1)

    await bounded([partial(setup, c) for c in clients], concurrency)
    return busy


class _Resumes:
    """The storm of one store: every planned reconnect resumed and judged, a replica killed."""

    def __init__(
        self,
        store: HttpStore,
        servers: Servers,
        routes: _Routes,
        proxy: TcpProxy | None,
        planned: int,
        kill_replica: bool,
    ) -> None:
        self._store = store
        self._servers = servers
        self._routes = routes
        self._proxy = proxy
        self.tally = Tally()
        self.latencies: list[float] = []
        self.attempts = 0
        self.killed: dict[str, Any] = {}
        self.wall = 0.0
        self.redis_cost: dict[str, Any] | None = None
        self._done = 0
        self._kill_at = planned // 2 if kill_replica else -1
        self._killed_at = float("inf")
        self._t0 = 0.0
        self._cpu_at_kill: list[float | None] = []
        self._cpu_before: list[float | None] = []
        self._cpu_after: list[float | None] = []

    async def run(
        self,
        http: httpx.AsyncClient,
        plan: list[tuple[_Client, Reconnect]],
        probe: RedisProbe | None,
        concurrency: int,
        advance: Callable[[int], None],
    ) -> None:
        """Every reconnect, ``concurrency`` at once; the replicas' and Redis's CPU around them."""

        async def resume(c: _Client, r: Reconnect) -> None:
            await self._resume(http, c, r)
            advance(1)

        self._cpu_before = self._servers.cpu_seconds()
        redis_before = None if probe is None else await probe.sample()
        self._t0 = time.monotonic()
        await bounded([partial(resume, c, r) for c, r in plan], concurrency)
        self.wall = time.monotonic() - self._t0
        self._cpu_after = self._servers.cpu_seconds()
        if probe is not None and redis_before is not None:
            self.redis_cost = (await probe.sample()).minus(redis_before)

    async def _resume(self, http: httpx.AsyncClient, c: _Client, r: Reconnect) -> None:
        t = time.monotonic()
        reply, n, answered = await _resume(http, c, self._routes, r.cursor)
        self.latencies.append(time.monotonic() - t)
        self.attempts += n
        # Asked after its replica died: a store in process memory lost the session.
        gone = self._store.process_local and c.home == 0 and answered >= self._killed_at
        possible = r.kind == "normal" and not gone
        self.tally.add(r, reply, _judge(c, r, reply, possible), possible=possible)
        self._done += 1
        if self._done == self._kill_at:
            self._kill()

    def _kill(self) -> None:
        self._cpu_at_kill.extend(self._servers.cpu_seconds())
        self._killed_at = time.monotonic()
        self._servers.kill(0)
        self._routes.live.remove(0)
        if self._proxy is not None:  # the balancer's health check takes it out
            self._proxy.set_upstreams(self._servers.addresses[1:])
        self.killed.update(
            replica=0, after_resumes=self._done, at_s=round(time.monotonic() - self._t0, 3)
        )

    def cpu(self) -> list[float | None]:
        """Each replica's CPU seconds over the storm (the killed one's until it died)."""
        after = list(self._cpu_after)
        if self._cpu_at_kill:
            after[0] = self._cpu_at_kill[0]
        return [
            None if a is None or b is None else round(a - b, 3)
            for a, b in zip(after, self._cpu_before, strict=True)
        ]


def _quantiles(latencies: list[float]) -> Callable[[float], float | None]:
    lat = sorted(latencies)

    def q(x: float) -> float | None:
        if not lat:
            return None
        return round(lat[min(len(lat) - 1, int(x * len(lat)))] * 1e3, 3)

    return q


def _row(
    store: HttpStore,
    tally: Tally,
    latencies: list[float],
    *,
    wall: float,
    setup_s: float,
    attempts: int,
    cpu: list[float | None],
    redis_cost: dict[str, Any] | None,
    killed: dict[str, Any],
    sessions: int,
    setup_retries: int,
) -> dict[str, Any]:
    q = _quantiles(latencies)
    resumes = len(latencies)
    measured = [c for c in cpu if c is not None]
    row: dict[str, Any] = {
        "name": store.name,
        "store": store.store,
        "what": store.what,
        "routing": "sticky" if store.sticky else "round-robin",
        "in_process": not store.redis,
        "resumes": resumes,
        "attempts": attempts,
        # Every client has its missed events or its 404 by then (the storm's wall time).
        "recovery_s": round(wall, 3),
        "resumes_per_s": round(resumes / wall, 1) if wall > 0 else None,
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "p999_ms": q(0.999),
        "appends": sessions * (NOTIFICATIONS + 1),
        "appends_per_s": None,
        "setup_seconds": round(setup_s, 2),
        # Sessions started over after a 503 (a replica shedding load) during setup.
        "setup_retries": setup_retries,
        **tally.as_dict(),
        "replica_cpu_s": cpu,
        "replica_cpu_us_per_resume": round(sum(measured) / resumes * 1e6, 1)
        if resumes and measured
        else None,
        "latency_cdf_ms": [q(i / 100) for i in range(101)],
        "resume_by_history": {},
    }
    if killed:
        row["killed"] = killed
    if redis_cost is not None and resumes:
        row["redis"] = {
            "cpu_us_per_resume": round(redis_cost["cpu_s"] / resumes * 1e6, 2),
            "storm": redis_cost,
        }
    return row

"""``replaystore bench task-streams``: a reconnect storm on task event streams, judged exactly.

Replicas of ``replaystore example-server`` on one Redis run ``countdown``
tasks (one task event per step). Every task has a reader that reads a few
events (1 to ``--per-connection``), drops the connection, and opens
``tasks/stream`` again on a replica picked at random, until the task's end;
each reader's events are then compared, ``seq`` by ``seq``, with what the
store holds. Two readers, each on tasks of its own, one after the other, so
that each one's CPU is its own:

- ``replaystore``: :meth:`TaskClient.stream_events` resuming with ``after``
  the last ``seq`` it got: it must get every stored event once, in order;
- ``listen (no replay)``: the same schedule, but each new connection starts
  at the task's newest event (``after`` its last issued ``seq``, read from
  the store as the reconnect happens), as a listener that gets only live
  events does: what it loses while it reconnects is counted;
- ``replaystore, finished tasks``: the resuming reader on tasks that ended
  before the phase began: the CPU of resumes alone, with no task running.

Then ``raw LRANGE``: the Redis CPU of one ``LRANGE`` of as many entries as a
resume read, on a list of the same size, as a floor for the store's share of
a resume: back to back, and at the pace of the finished tasks' resumes (the
floor a resume at that pace compares with; the report prints the ratio).
Redis CPU is the server's own (``INFO cpu``), so it means something only on
a Redis nobody else uses meanwhile (``--spawn-redis``).
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2

from ...buffer import ReplayBuffer
from ...mcp.client import TaskClient, TaskEvent
from ...testing.servers import find_free_port
from ..servers import HOST, Servers
from ..stores import RedisProbe
from ..storm import RUN_PREFIX, delete_run_keys

__all__ = ["TaskStreamOptions", "markdown", "run_task_streams"]

#: The example server's MCP server name: the namespace its tasks are stored under.
NAMESPACE = "replaystore-example"
#: The readers (phases), in the order they run.
RESUMING = "replaystore"
LIVE = "listen (no replay)"
FINISHED = "replaystore, finished tasks"


@dataclass
class TaskStreamOptions:
    url: str
    replicas: int = 3
    tasks: int = 50
    steps: int = 40
    interval_ms: int = 20
    per_connection: int = 4
    seed: int = 20_261_207


@dataclass
class Reading:
    """What one reader got of one task."""

    events: list[TaskEvent] = field(default_factory=list)
    resumes: int = 0


async def _read_resuming(
    urls: list[str], http: httpx2.AsyncClient, task_id: str, rng: random.Random, per_connection: int
) -> Reading:
    """Resume with ``after`` on a random replica every 1..per_connection events."""
    reading = Reading()
    last: int | None = None
    while True:
        client = TaskClient(rng.choice(urls), http=http, backoff=0.02, max_backoff=1.0)
        stream = client.stream_events(task_id, after=last, idle_timeout=10.0)
        keep = rng.randint(1, per_connection)
        got = 0
        async with stream:
            async for event in stream:
                reading.events.append(event)
                got += 1
                if got == keep:
                    break
        reading.resumes += stream.requests
        last = stream.last_seq
        if stream.completed:
            return reading


async def _read_live_only(
    urls: list[str],
    http: httpx2.AsyncClient,
    task_id: str,
    rng: random.Random,
    per_connection: int,
    store: Any,
) -> Reading:
    """The same schedule, each connection from the task's newest event on: no replay."""
    reading = Reading()
    while True:
        page = await store.events(task_id, limit=1)
        client = TaskClient(rng.choice(urls), http=http, backoff=0.02, max_backoff=1.0)
        stream = client.stream_events(task_id, after=page.next_seq - 1, idle_timeout=10.0)
        keep = rng.randint(1, per_connection)
        got = 0
        async with stream:
            async for event in stream:
                reading.events.append(event)
                got += 1
                if got == keep:
                    break
        reading.resumes += stream.requests
        if stream.completed:
            return reading


def _judge(stored: Sequence[Any], got: list[TaskEvent]) -> dict[str, int]:
    """Compare a reader's events with the store's, seq by seq."""
    truth = {e.seq: (e.type, e.payload) for e in stored}
    seen: dict[int, int] = {}
    wrong = 0
    for event in got:
        seen[event.seq] = seen.get(event.seq, 0) + 1
        if truth.get(event.seq) != (event.type, event.payload):
            wrong += 1
    seqs = [e.seq for e in got]
    return {
        "stored": len(truth),
        "received": len(got),
        "lost": sum(1 for seq in truth if seq not in seen),
        "duplicates": sum(n - 1 for n in seen.values()),
        "out_of_order": sum(1 for a, b in itertools.pairwise(seqs) if b <= a),
        "wrong": wrong,
    }


async def _create(http: httpx2.AsyncClient, url: str, steps: int, interval_ms: int) -> str:
    """A countdown task created on the replica at ``url``; its id."""
    arguments = {"n": steps, "interval_ms": interval_ms}
    created = await TaskClient(url, http=http).request(
        "tools/call", {"name": "countdown", "arguments": arguments}, "countdown"
    )
    return str(created["taskId"])


async def _phase(
    name: str,
    o: TaskStreamOptions,
    urls: list[str],
    servers: Servers,
    probe: RedisProbe,
    store: Any,
) -> dict[str, Any]:
    """``o.tasks`` countdowns, each read from its creation by reader ``name``; the figures.

    The CPU figures cover the whole phase: for the first two readers the
    tasks' own work (creation, leases, events) is in them, the same for
    both; :data:`FINISHED` reads tasks that ended before the clock started,
    so its figures are the resumes' alone.
    """
    rng = random.Random(f"{o.seed}:{name}")
    limits = httpx2.Limits(max_keepalive_connections=0)  # every resume: a new connection
    async with httpx2.AsyncClient(limits=limits, timeout=30.0) as http:
        readings: dict[str, Reading] = {}
        done: list[str] = []
        if name == FINISHED:  # created and ended before the clock starts: resumes alone
            done = [await _create(http, urls[i % len(urls)], o.steps, 0) for i in range(o.tasks)]
            for task_id in done:
                await TaskClient(urls[0], http=http).wait(task_id)
        cpu_before = [c or 0.0 for c in servers.cpu_seconds()]
        redis_before = await probe.sample()
        began = time.monotonic()

        async def run(i: int) -> None:
            """Create a countdown on a replica, then read it from its start as ``name`` does."""
            url = urls[i % len(urls)]
            task_id = done[i] if done else await _create(http, url, o.steps, o.interval_ms)
            if name == LIVE:
                reading = await _read_live_only(urls, http, task_id, rng, o.per_connection, store)
            else:
                reading = await _read_resuming(urls, http, task_id, rng, o.per_connection)
            readings[task_id] = reading

        async with anyio.create_task_group() as group:
            for i in range(o.tasks):
                group.start_soon(run, i)
        seconds = time.monotonic() - began
        redis = (await probe.sample()).minus(redis_before)
        cpu_after = [c or 0.0 for c in servers.cpu_seconds()]
    totals: dict[str, int] = {}
    exact = 0
    for task_id, reading in readings.items():
        page = await store.events(task_id, start=0, limit=o.steps + 10)
        judged = _judge(page.events, reading.events)
        exact += all(judged[k] == 0 for k in ("lost", "duplicates", "out_of_order", "wrong"))
        for key, value in judged.items():
            totals[key] = totals.get(key, 0) + value
    resumes = sum(r.resumes for r in readings.values())
    replica_cpu = sum(after - before for before, after in zip(cpu_before, cpu_after, strict=True))
    return {
        "name": name,
        "tasks": len(readings),
        "exact_tasks": exact,
        **totals,
        "resumes": resumes,
        "seconds": round(seconds, 2),
        "resumes_per_s": round(resumes / seconds, 1) if seconds else 0.0,
        "replica_cpu_ms_per_resume": round(1000 * replica_cpu / resumes, 3) if resumes else None,
        "redis_cpu_ms_per_resume": round(1000 * redis["cpu_s"] / resumes, 4) if resumes else None,
        "redis_commands": redis["commandstats"],
    }


async def _raw_lrange(
    o: TaskStreamOptions, probe: RedisProbe, prefix: str, finished: dict[str, Any]
) -> list[dict[str, Any]]:
    """Redis CPU of one LRANGE as large as a resume's read, on a list as long as a task's.

    Twice: back to back from one client (Redis never waits for work, so each
    call costs it least), and at the finished tasks' pace: as many calls as
    their resumes, from as many clients at once as there were readers, over
    as long as the resumes took. Redis spends CPU on each wake-up from waiting
    for work and on its timers meanwhile, so a call that comes alone costs it
    more than one in a busy loop: the second figure is the floor for a resume
    at that pace, one round trip on a connection kept open.
    """
    from redis.asyncio import Redis

    redis = Redis.from_url(o.url.split("?", 1)[0])
    key = f"{prefix}raw-lrange"
    entry = b"x" * 80
    rng = random.Random(f"{o.seed}:raw")
    rows = []

    async def calls(n: int, gap: float) -> None:
        """``n`` LRANGEs, each ``gap`` seconds after the last on average (0: back to back)."""
        for i in range(n):
            start = i % (o.steps + 2)
            await redis.lrange(key, start, start + o.per_connection - 1)
            if gap:
                await anyio.sleep(rng.uniform(0, 2 * gap))

    resumes, clients = finished["resumes"], max(1, finished["tasks"])
    gap = clients * finished["seconds"] / resumes if resumes else 0.0
    try:
        await redis.rpush(key, *([entry] * (o.steps + 2)))
        plans = (("raw LRANGE, back to back", 2000, 1, 0.0),
                 ("raw LRANGE, at the resumes' pace", resumes, clients, gap))  # fmt: skip
        for name, total, width, wait in plans:
            before = await probe.sample()
            began = time.monotonic()
            async with anyio.create_task_group() as group:
                for c in range(width):
                    group.start_soon(calls, total // width + (c < total % width), wait)
            cost = (await probe.sample()).minus(before)
            rows.append({"name": name, "calls": total, "clients": width,
                         "seconds": round(time.monotonic() - began, 2),
                         "redis_cpu_ms_per_resume": round(1000 * cost["cpu_s"] / total, 4)
                         if total else None})  # fmt: skip
    finally:
        await redis.delete(key)
        await redis.aclose()
    return rows


def run_task_streams(o: TaskStreamOptions, logs: Path | None = None) -> dict[str, Any]:
    """Start the replicas, run both readers and the raw floor; the report (always cleaned up)."""
    prefix = f"{RUN_PREFIX}{secrets.token_hex(4)}:tasks:"
    separator = "&" if "?" in o.url else "?"
    store_url = f"{o.url}{separator}prefix={prefix}"
    ports = [find_free_port() for _ in range(o.replicas)]
    commands = [
        ([sys.executable, "-m", "replaystore", "example-server", "--host", HOST,
          "--port", str(port), "--url", store_url, "--log-level", "warning",
          "--task-events", str(o.steps + 10)], [port])
        for port in ports
    ]  # fmt: skip
    urls = [f"http://{HOST}:{port}/mcp" for port in ports]
    began = time.monotonic()
    try:
        with Servers(commands, logs=logs) as servers:
            report = anyio.run(_run, o, urls, servers, store_url, prefix)
    finally:
        delete_run_keys(o.url, prefix)
    report["meta"] = {
        "options": o.__dict__,
        "seconds": round(time.monotonic() - began, 1),
        "redis_note": "Redis CPU is the server's own: meaningful on a Redis nobody else uses",
    }
    return report


async def _run(
    o: TaskStreamOptions, urls: list[str], servers: Servers, store_url: str, prefix: str
) -> dict[str, Any]:
    from ...backends.coordination import coordination_of

    probe = RedisProbe(o.url)
    buffer = ReplayBuffer.from_url(store_url)
    try:
        store = coordination_of(buffer.backend).task_store(namespace=NAMESPACE)
        rows = [await _phase(name, o, urls, servers, probe, store)
                for name in (RESUMING, LIVE, FINISHED)]  # fmt: skip
        rows.extend(await _raw_lrange(o, probe, prefix, rows[-1]))
    finally:
        await buffer.aclose()
        await probe.aclose()
    resume, paced = rows[2]["redis_cpu_ms_per_resume"], rows[-1]["redis_cpu_ms_per_resume"]
    ratio = round(resume / paced, 2) if resume is not None and paced else None
    return {"readers": rows, "finished_over_paced_lrange": ratio}


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table."""
    head = ("reader", "exact tasks", "stored", "received", "lost", "duplicates",
            "out of order", "resumes", "resumes/s", "replica CPU ms/resume",
            "Redis CPU ms/resume")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["readers"]:
        tasks = f"{row['exact_tasks']}/{row['tasks']}" if "tasks" in row else ""
        cells = [row["name"], tasks, *(str(row.get(k, "")) for k in (
            "stored", "received", "lost", "duplicates", "out_of_order", "resumes",
            "resumes_per_s", "replica_cpu_ms_per_resume", "redis_cpu_ms_per_resume"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    ratio = report.get("finished_over_paced_lrange")
    if ratio is not None:
        lines.append(f"\nRedis CPU per finished-task resume / raw LRANGE at its pace: {ratio}x")
    return "\n".join(lines)


def main(args: Any, argv: Sequence[str]) -> int:
    """Run from ``replaystore bench task-streams`` options; print the table, write the JSON."""
    options = TaskStreamOptions(
        url=args.url, replicas=args.replicas, tasks=args.tasks, steps=args.steps,
        interval_ms=args.interval_ms, per_connection=args.per_connection, seed=args.seed,
    )  # fmt: skip
    if args.spawn_redis:
        from ...testing.servers import redis_server_binary, start_standalone

        with start_standalone(redis_server_binary()) as handle:
            options.url = handle.url
            report = run_task_streams(options)
    else:
        report = run_task_streams(options)
    report["meta"]["command"] = " ".join(["replaystore", "bench", *argv])
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(markdown(report))
    return 0

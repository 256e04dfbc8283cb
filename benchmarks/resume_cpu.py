"""CPU per resume, client and Redis, replaystore against the raw floor.

The reconnect storm (``replaystore bench storm``) is paced by the CPU a resume
costs: the replica processes' (the client library) and Redis's. This measures
both for one kind of resume, the storm's common one, in one process against a
private ``redis-server``, so a change to the resume path can be judged in a
minute rather than from a whole storm:

* ``--sessions`` sessions, each with two streams of ``--events`` events each
  (200-byte payloads, written in turn as an MCP session's streams are);
* replaystore: ``resolve_and_replay(session, cursor, sequence=stream)`` with the
  cursor of the third-newest event of a stream (two events replayed);
* the raw floor: the storm's ``raw-streams`` store, one Redis stream per stream
  and one ``XRANGE key (<id> +`` per resume, through redis-py;
* ``--concurrency`` resumes in flight (the storm's default per replica: 32),
  every session once per pass; the two alternate, ``--rounds`` passes each.

Client CPU is ``time.process_time()`` over a pass; Redis CPU the ``INFO cpu``
(``used_cpu_user + used_cpu_sys``) delta over the same pass, with the server
time of ``INFO commandstats`` beside it. Reported per resume, medians over the
rounds, and their ratios to the floor. Absolute figures are this machine's;
compare the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from replaystore import ReplayBuffer
from replaystore.bench.worker import bounded

from .common import commandstats, payload, redis_server, text

STREAMS = ("_GET_stream", "1")
_ADMIN = ("info", "config|resetstat")


async def _redis_cpu(admin: aioredis.Redis) -> float:
    info: dict[str, Any] = await admin.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _measure(
    admin: aioredis.Redis, jobs: list[Callable[[], Awaitable[object]]], concurrency: int
) -> dict[str, float]:
    """One pass: client and Redis CPU per job, and commandstats server time per job."""
    gc.collect()
    await admin.config_resetstat()
    redis_before = await _redis_cpu(admin)
    began_cpu, began = time.process_time(), time.perf_counter()
    await bounded(jobs, concurrency)
    client_cpu, wall = time.process_time() - began_cpu, time.perf_counter() - began
    redis_cpu = await _redis_cpu(admin) - redis_before
    stats = await commandstats(admin)
    server_us = sum(u for name, (_, u) in stats.items() if name not in _ADMIN)
    n = len(jobs)
    return {
        "client_us": client_cpu / n * 1e6,
        "redis_us": redis_cpu / n * 1e6,
        "commandstats_us": server_us / n,
        "resumes_per_s": n / wall,
    }


async def run(
    url: str, *, sessions: int, events: int, rounds: int, concurrency: int
) -> dict[str, Any]:
    """Fill the sessions, then alternate passes of both sides; the medians and their ratios."""
    admin = aioredis.Redis.from_url(url)
    raw = aioredis.Redis.from_url(url)  # as the storm's raw-streams store builds it
    buf = ReplayBuffer.from_url(url, prefix="rc:", max_events=1000)
    try:
        await buf.backend.connect()
        names = [f"s{i:06d}" for i in range(sessions)]
        cursors, raw_cursors = await _fill(buf, raw, names, events)

        async def ours(name: str, k: int) -> object:
            res = await buf.resolve_and_replay(name, cursors[name][k], sequence=STREAMS[k])
            assert res.ok and len(res.events) == 2, res.verdict
            return res

        async def floor(name: str, k: int) -> object:
            got = await raw.xrange(f"rc-raw:{name}:{STREAMS[k]}", min=f"({raw_cursors[name][k]}")
            assert got is not None and len(got) == 2
            return got

        def jobs(op: Callable[[str, int], Awaitable[object]], r: int) -> list[Any]:
            k = r % len(STREAMS)
            return [lambda n=n: op(n, k) for n in names]

        # warm up both paths (connections, caches), then alternate
        await _measure(admin, jobs(ours, 0)[: min(200, sessions)], concurrency)
        await _measure(admin, jobs(floor, 0)[: min(200, sessions)], concurrency)
        subject: list[dict[str, float]] = []
        baseline: list[dict[str, float]] = []
        for r in range(rounds):
            order = [(ours, subject), (floor, baseline)]
            if r % 2:
                order.reverse()
            for op, sink in order:
                sink.append(await _measure(admin, jobs(op, r), concurrency))
    finally:
        await buf.aclose()
        await raw.aclose()
        await admin.aclose()
    return {
        "meta": {
            "sessions": sessions,
            "events_per_stream": events,
            "rounds": rounds,
            "concurrency": concurrency,
        },
        "summary": _summary(subject, baseline),
        "rounds": {"replaystore": subject, "raw": baseline},
    }


async def _fill(
    buf: ReplayBuffer, raw: aioredis.Redis, names: list[str], events: int
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each session's streams on both sides; the cursor each stream is resumed from."""
    cursors: dict[str, list[str]] = {}
    raw_cursors: dict[str, list[str]] = {}
    for name in names:
        await buf.open_session(name)
        ids: dict[str, list[str]] = {s: [] for s in STREAMS}
        raw_ids: dict[str, list[str]] = {s: [] for s in STREAMS}
        for k in range(events):
            for s in STREAMS:
                ids[s].append(await buf.append(name, s, payload(k)))
                key = f"rc-raw:{name}:{s}"
                raw_ids[s].append(text(await raw.xadd(key, {"d": payload(k)})))
        cursors[name] = [ids[s][-3] for s in STREAMS]
        raw_cursors[name] = [raw_ids[s][-3] for s in STREAMS]
    return cursors, raw_cursors


def _summary(
    subject: list[dict[str, float]], baseline: list[dict[str, float]]
) -> dict[str, dict[str, Any]]:
    """Per figure: the median of each side over the rounds, their ratio, each round's ratio."""

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    figures = ("client_us", "redis_us", "commandstats_us", "resumes_per_s")
    return {
        key: {
            "replaystore": round(median(subject, key), 2),
            "raw": round(median(baseline, key), 2),
            "ratio": round(median(subject, key) / median(baseline, key), 3),
            "ratio_per_round": [
                round(s[key] / b[key], 3) for s, b in zip(subject, baseline, strict=True)
            ],
        }
        for key in figures
    }


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"CPU per resume: {meta['sessions']} sessions, {meta['concurrency']} in flight, "
        f"{meta['rounds']} rounds (2 events replayed per resume)",
        f"  {'figure':<28} {'replaystore':>12} {'raw':>10} {'ratio':>7}  per round",
    ]
    labels = {
        "client_us": "client CPU µs/resume",
        "redis_us": "Redis CPU µs/resume",
        "commandstats_us": "Redis commandstats µs/resume",
        "resumes_per_s": "resumes/s (one process)",
    }
    for key, label in labels.items():
        row = results["summary"][key]
        per = " ".join(f"{x:.2f}" for x in row["ratio_per_round"])
        lines.append(
            f"  {label:<28} {row['replaystore']:>12.1f} {row['raw']:>10.1f} "
            f"{row['ratio']:>6.2f}x  {per}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.resume_cpu", description=__doc__)
    parser.add_argument("--sessions", type=int, default=3000)
    parser.add_argument("--events", type=int, default=4, help="events per stream (>= 3)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", help="write every figure to this JSON file")
    args = parser.parse_args(argv)
    if args.events < 3 or args.sessions < 1 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--events >= 3, and --sessions, --rounds, --concurrency >= 1")
    with redis_server() as handle:
        results = asyncio.run(
            run(
                handle.url,
                sessions=args.sessions,
                events=args.events,
                rounds=args.rounds,
                concurrency=args.concurrency,
            )
        )
    print(render(results))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

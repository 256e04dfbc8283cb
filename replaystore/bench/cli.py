"""``replaystore bench storm``: the command line of the storm benchmark."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..buffer import ReplayBuffer
from ..errors import ReplayStoreError
from .stores import CATALOG, HTTP_STORES, is_plain_redis_url, is_redis_url
from .storm import RUN_PREFIX, Options, delete_run_keys, run_storm, storm_meta

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replaystore bench", description="Benchmarks against the stores people use."
    )
    sub = parser.add_subparsers(dest="benchmark", required=True)
    storm = sub.add_parser(
        "storm",
        help="a reconnect storm, every reconnect judged against ground truth",
        description="Sessions fill up, then most of their clients reconnect at once (some with "
        "a conflated, evicted, ahead or foreign cursor, or a second connection) while writers "
        "keep appending. Every store answers the same reconnects; each answer is judged "
        "against what was stored. Prints a markdown table; progress goes to stderr (a bar "
        "on a terminal, lines elsewhere).",
    )
    _where(storm)
    _workload(storm)
    _modes(storm)
    _output(storm)
    _task_streams(sub)
    return parser


def _task_streams(sub: Any) -> None:
    """``task-streams``: readers of task event streams reconnecting at random, judged exactly."""
    run = sub.add_parser(
        "task-streams",
        help="a reconnect storm on task event streams (tasks/stream), judged against the store",
        description="example-server replicas on one Redis run countdown tasks; each task's "
        "reader drops its connection every few events and resumes with `after` on a random "
        "replica, beside a listener that gets live events only. Every reader's events are "
        "judged against what the store holds. Prints a markdown table.",
    )
    run.add_argument("--url", default=None, help="a Redis URL: redis://host:port/db")
    run.add_argument(
        "--spawn-redis", action="store_true", help="start a throw-away redis-server and use it"
    )
    run.add_argument("--replicas", type=int, default=3, help="replica processes (default: 3)")
    run.add_argument("--tasks", type=int, default=50, help="tasks per reader (default: 50)")
    run.add_argument("--steps", type=int, default=40, help="countdown steps (default: 40)")
    run.add_argument(
        "--interval-ms", type=int, default=20, help="countdown step interval (default: 20)"
    )
    run.add_argument(
        "--per-connection",
        type=int,
        default=4,
        help="events read before a reader drops its connection: 1 to this (default: 4)",
    )
    run.add_argument("--seed", type=int, default=20_261_207, help="workload seed")
    run.add_argument("--json", type=Path, help="write every figure to this JSON file")


def _where(storm: argparse.ArgumentParser) -> None:
    """Which backend the storm runs on: a URL, or a Redis it starts and stops itself."""
    storm.add_argument(
        "--url",
        default="memory://",
        help="backend: memory:// (one process), redis://host:port/db or "
        "redis+cluster://host:port[,host:port...] (default: memory://)",
    )
    storm.add_argument(
        "--spawn-redis",
        action="store_true",
        help="start a throw-away redis-server (from PATH) on a free loopback port and use it",
    )
    storm.add_argument(
        "--spawn-cluster",
        action="store_true",
        help="start a throw-away Redis Cluster of 3 masters (redis-server from PATH) on "
        "loopback ports and use it (redis+cluster://)",
    )


def _workload(storm: argparse.ArgumentParser) -> None:
    """How many sessions, replicas and calls, which stores, how many reconnect and how."""
    storm.add_argument("--sessions", type=int, default=1000, help="sessions (default: 1000)")
    storm.add_argument(
        "--replicas",
        type=int,
        default=2,
        help="replica processes sharing the Redis (default: 2; memory:// runs one)",
    )
    storm.add_argument(
        "--store",
        action="append",
        choices=sorted({*CATALOG, *(s.store for s in HTTP_STORES)}),
        dest="stores",
        help="a store to run (repeat; default: every store that runs on the URL; "
        "floor runs with --http only)",
    )
    storm.add_argument(
        "--events",
        type=int,
        default=4,
        help="events per stream before the storm: half to twice this (default: 4)",
    )
    storm.add_argument(
        "--share", type=float, default=0.8, help="share of the sessions that reconnect (0.8)"
    )
    storm.add_argument(
        "--pathology-rate",
        type=float,
        default=0.1,
        help="share of the sessions whose reconnect is pathological, split evenly over the "
        "kinds (default: 0.1)",
    )
    storm.add_argument(
        "--concurrency", type=int, default=32, help="calls in flight per replica (default: 32)"
    )
    storm.add_argument(
        "--append-rate",
        type=float,
        default=400.0,
        help="appends per second, all replicas together, during the storm (default: 400)",
    )


def _modes(storm: argparse.ArgumentParser) -> None:
    """Over the MCP wire or on the bare stores; one storm or several pooled; the seed."""
    storm.add_argument(
        "--http",
        action="store_true",
        help="end to end over MCP HTTP: each store behind --replicas server processes "
        "(replaystore round-robin and sticky, the SDK example's in-memory store sticky, "
        "FastMCP's Redis store sticky, and the floor: a bare ASGI app, one Redis read per "
        "resume), the same clients and tool call",
    )
    storm.add_argument(
        "--kill-replica",
        action="store_true",
        help="with --http: kill one replica (SIGKILL) half-way through each store's storm",
    )
    storm.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="fill and storm every store this many times, alternating their order (one storm "
        "is short: a ratio of one round is noisy); the bare-store storm pools the rounds, "
        "--http gives each store's medians over them, each on fresh server processes; "
        "each round's ratios are reported beside (default: 1)",
    )
    storm.add_argument("--seed", type=int, default=20_251_202, help="workload seed")


def _output(storm: argparse.ArgumentParser) -> None:
    """Where the figures go besides the table on stdout."""
    storm.add_argument("--json", type=Path, help="write every figure to this JSON file")
    storm.add_argument("--plots", type=Path, help="write PNG plots into this directory")
    storm.add_argument("--no-progress", action="store_true", help="no progress on stderr")


def _unreachable(url: str) -> str | None:
    """Why the Redis at ``url`` cannot be used, or ``None`` (checked once, before any replica)."""
    import asyncio

    from .stores import RedisProbe

    async def ping() -> None:
        probe = RedisProbe(url)
        try:
            await probe.server()
        finally:
            await probe.aclose()

    try:
        asyncio.run(ping())
    except Exception as exc:  # any failure to connect is the answer
        return str(exc) or type(exc).__name__
    return None


def _run_http(options: Options, kill_replica: bool) -> dict[str, Any]:
    from .http import HttpRun, run_http_storm
    from .truth import http_ratios_and_targets

    # What the replicas store goes under a prefix of this run, deleted when it
    # ends however it ends: a shared Redis keeps nothing of the benchmark.
    prefix = f"{RUN_PREFIX}{secrets.token_hex(4)}:http:"
    unavailable = [
        {"name": name, "reason": "not on the MCP wire here (bare-store storm only)"}
        for name in options.stores
        if name not in {s.store for s in HTTP_STORES}
    ]
    began = time.monotonic()
    try:
        run = HttpRun(
            options.url,
            sessions=options.sessions,
            replicas=options.replicas,
            concurrency=options.concurrency,
            pathology_rate=options.pathology_rate,
            seed=options.seed,
            kill_replica=kill_replica,
        )
        rows = run_http_storm(
            run,
            stores=options.stores,
            prefix=prefix,
            rounds=options.rounds,
            progress=options.progress,
        )
    finally:
        delete_run_keys(options.url, prefix)
    meta = storm_meta(options, options.replicas, redis=True)
    meta["seconds"] = round(time.monotonic() - began, 1)
    meta["http"] = True
    meta["kill_replica"] = kill_replica
    meta["options"]["share"] = 1.0  # every client reconnects
    ratios, targets = http_ratios_and_targets(rows)
    return {
        "meta": meta,
        "stores": rows,
        "unavailable": unavailable,
        "ratios": ratios,
        "targets": targets,
    }


def _bad_url(url: str) -> str | None:
    """Why the storm cannot run on ``url``, or ``None``: checked before anything starts."""
    if not (is_redis_url(url) or url.split(":", 1)[0].lower() == "memory"):
        return (
            "--url must be memory://, redis://host:port/db (or rediss://) or "
            f"redis+cluster://host:port[,host:port...], not {url!r}"
        )
    try:
        ReplayBuffer.from_url(url)
    except ReplayStoreError as exc:
        return str(exc)
    return None


def _no_plots() -> str | None:
    """Why ``--plots`` cannot be written, or ``None``: known before a long run, not after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plots needs matplotlib: pip install 'replaystore[bench]' (or drop --plots)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if args.benchmark == "task-streams":
        return _main_task_streams(args, argv)
    try:
        return _main(args, argv)
    except KeyboardInterrupt:
        # The replicas are stopped and the run's keys deleted on the way out.
        print("replaystore bench: interrupted", file=sys.stderr)
        return 130


def _main_task_streams(args: argparse.Namespace, argv: list[str]) -> int:
    """Check the task-streams options, then run it."""
    from .task_streams import main as task_streams

    checks = [
        (args.spawn_redis != (args.url is not None), "give --url redis://... or --spawn-redis"),
        (args.url is None or is_plain_redis_url(args.url), "--url must be redis://host:port/db"),
        (args.replicas >= 1, "--replicas must be at least 1"),
        (args.tasks >= 1, "--tasks must be at least 1"),
        (args.steps >= 1, "--steps must be at least 1"),
        (args.interval_ms >= 0, "--interval-ms must not be negative"),
        (args.per_connection >= 1, "--per-connection must be at least 1"),
    ]
    problem = next((message for ok, message in checks if not ok), None)
    if problem is None and args.url is not None:
        reason = _unreachable(args.url)
        problem = f"cannot reach {args.url}: {reason}" if reason else None
    if problem is not None:
        print(f"replaystore bench: {problem}", file=sys.stderr)
        return 2
    try:
        return task_streams(args, argv)
    except KeyboardInterrupt:
        print("replaystore bench: interrupted", file=sys.stderr)
        return 130


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    """Check the options, run the storm, then write and print what it found."""
    problem = _invalid(args) or _unusable(args)
    if problem is not None:
        print(f"replaystore bench: {problem}", file=sys.stderr)
        return 2
    report = _run(args, _options(args))
    report["meta"]["command"] = shlex.join(["replaystore", "bench", *argv])
    return _report(args, report)


def _invalid(args: argparse.Namespace) -> str | None:
    """The first option that cannot work, said as the user wrote it; ``None`` if all can."""
    checks = [
        (args.sessions >= 1, "--sessions must be at least 1"),
        (args.replicas >= 1, "--replicas must be at least 1"),
        (args.concurrency >= 1, "--concurrency must be at least 1"),
        (args.events >= 1, "--events must be at least 1"),
        (0 <= args.share <= 1, "--share must be between 0 and 1"),
        (0 <= args.pathology_rate <= 1, "--pathology-rate must be between 0 and 1"),
        (args.append_rate >= 0, "--append-rate must not be negative"),
        (args.rounds >= 1, "--rounds must be at least 1"),
        (
            args.http or not set(args.stores or []) - set(CATALOG),
            "--store floor runs with --http (the bare-store storm's floor is raw-streams)",
        ),
        (args.http or not args.kill_replica, "--kill-replica needs --http"),
        (
            not (args.spawn_redis and args.spawn_cluster),
            "--spawn-redis and --spawn-cluster exclude each other: pick one",
        ),
        (
            not (args.http and args.spawn_cluster),
            "--http runs on one Redis: use --spawn-redis, not --spawn-cluster",
        ),
    ]
    if not (args.spawn_redis or args.spawn_cluster):
        why = _bad_url(args.url)
        checks.append((why is None, why or ""))
    if args.plots is not None:
        why = _no_plots()
        checks.append((why is None, why or ""))
    return next((message for ok, message in checks if not ok), None)


def _unusable(args: argparse.Namespace) -> str | None:
    """Why the Redis the options name cannot carry this storm, or ``None``."""
    spawn = args.spawn_redis or args.spawn_cluster
    if is_redis_url(args.url) and not spawn:
        problem = _unreachable(args.url)
        if problem:
            return f"cannot reach {args.url}: {problem}"
    if args.http and not args.spawn_redis and not is_plain_redis_url(args.url):
        return "--http needs --url redis://... or --spawn-redis"
    return None


def _options(args: argparse.Namespace) -> Options:
    return Options(
        url=args.url,
        sessions=args.sessions,
        replicas=args.replicas,
        stores=args.stores or [],
        events=args.events,
        share=args.share,
        pathology_rate=args.pathology_rate,
        concurrency=args.concurrency,
        append_rate=args.append_rate,
        seed=args.seed,
        progress=not args.no_progress,
        rounds=args.rounds,
    )


def _run(args: argparse.Namespace, options: Options) -> dict[str, Any]:
    """The storm's report, on a Redis started for it when asked (and stopped after)."""

    def run(o: Options) -> dict[str, Any]:
        return _run_http(o, args.kill_replica) if args.http else run_storm(o)

    if not (args.spawn_redis or args.spawn_cluster):
        return run(options)
    from ..testing.servers import redis_server_binary, start_cluster, start_standalone

    binary = redis_server_binary()
    with start_cluster(binary) if args.spawn_cluster else start_standalone(binary) as handle:
        options.url = handle.url
        report = run(options)
    report["meta"]["redis_started_by_command"] = True
    return report


def _report(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """Write the JSON and the plots asked for, print the table; the exit status."""
    from .report import markdown, write_plots

    written = []
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        written.append(f"JSON: {args.json}")
    status = 0
    if args.plots is not None:
        try:
            written += [f"plot: {path}" for path in write_plots(report, args.plots)]
        except Exception as exc:  # the run's figures are worth more than its pictures
            print(f"replaystore bench: plots not written: {exc}", file=sys.stderr)
            status = 1
    try:
        print(markdown(report))
        print("", *written, sep="\n")
    except BrokenPipeError:  # the reader went away (| head): the files are written
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return status

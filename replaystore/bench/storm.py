"""The reconnect storm: every store, the same workload, the same replicas, one Redis.

For each store in turn:

1. **fill**: the replica processes open their sessions and append every
   stream's events, as fast as ``concurrency`` callers per replica go
   (appends/s, Redis CPU and memory per event are read over this phase);
2. **storm**: the reconnects hit at once, ``concurrency`` in flight per
   replica, while writers keep appending to the live streams at a steady rate
   (resumes/s, latency, Redis CPU per resume);
3. **history**: one caller resumes sessions holding 10, 100 and 1,000 other
   events (the cost of a resume against history size, without queueing);
4. every answer is judged against the ground truth (:mod:`.truth`), and the
   store's keys are deleted.

The stores run one after another on the same Redis, so each has the server to
itself while it is measured. A storm of 10,000 sessions lasts about half a
second, and one such half second moves a ratio between two stores by a
tenth or more on a shared machine; ``rounds`` runs every store's fill and
storm that many times, alternating the stores' order, and pools the rounds
(counts and seconds added, latencies merged): the figures of one storm that
many times as long, with each round's ratios kept beside them to show the
spread.
"""

from __future__ import annotations

import asyncio
import os
import platform
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..testing.replicas import ReplicaPool
from .report import Bar
from .stores import (
    CATALOG,
    RedisProbe,
    Sample,
    StoreSpec,
    available,
    default_names,
    is_cluster_url,
    is_redis_url,
)
from .truth import Tally, judge, storm_ratios, storm_targets
from .workload import (
    EVICTED_PREFIX,
    PATHOLOGIES,
    Reconnect,
    SessionPlan,
    plan_reconnects,
    plan_sessions,
)

__all__ = ["RUN_PREFIX", "Options", "delete_run_keys", "run_storm", "storm_meta"]

_WORKER = "replaystore.bench.worker:serve"

#: Every key a run stores on Redis starts with this, then the run's id.
RUN_PREFIX = "rsbench:"


def delete_run_keys(url: str, prefix: str) -> int:
    """Delete the keys under ``prefix`` on the Redis at ``url``; how many (0 if unreachable).

    Runs in an event loop of its own, after the run's loop and replicas are
    gone, so it also works after an interrupt.
    """

    async def delete() -> int:
        probe = RedisProbe(url)
        try:
            return await probe.delete_prefix(prefix)
        finally:
            await probe.aclose()

    try:
        return asyncio.run(delete())
    except Exception:  # the store went away: nothing more can be cleaned up
        return 0


@dataclass(slots=True)
class Options:
    url: str = "memory://"
    sessions: int = 1000
    replicas: int = 2
    stores: list[str] = field(default_factory=list)  # empty: every store that runs on the URL
    events: int = 4  # events per stream before the storm: half to twice this
    share: float = 0.8  # of the sessions reconnect
    pathology_rate: float = 0.1  # of the sessions reconnect with a pathology
    concurrency: int = 32  # resumes (and fill callers) in flight per replica
    append_rate: float = 400.0  # appends/s (all replicas) during the storm
    writers: int = 4  # writer tasks per replica during the storm
    retention: int = 1000  # events per session (replaystore) / per stream (others)
    small_retention: int = 20  # the same, for the sessions of the evicted case
    seed: int = 20_251_202
    sweep: list[int] = field(default_factory=lambda: [10, 100, 1000])  # history sizes
    progress: bool = True
    rounds: int = 1  # each store's fill and storm this many times, pooled


@dataclass(slots=True)
class _Pooled:
    """One store's measurements over every round, added up for :func:`_figures`."""

    tally: Tally = field(default_factory=Tally)
    latencies: list[float] = field(default_factory=list)
    by_kind: dict[str, list[float]] = field(default_factory=dict)  # latencies per reconnect kind
    storm_wall: float = 0.0
    replica_cpu_s: float = 0.0  # the replica processes' CPU over the storms
    appends: int = 0
    fill_wall: float = 0.0
    fill_latencies: list[float] = field(default_factory=list)
    storm_appends: int = 0
    fill_cost: dict[str, Any] = field(default_factory=dict)
    storm_cost: dict[str, Any] = field(default_factory=dict)
    failed_writes: list[str] = field(default_factory=list)
    sweep: dict[str, Any] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)  # each round's own figures


def _add_cost(total: dict[str, Any], more: dict[str, Any]) -> None:
    """Add one phase's Redis figures (:meth:`.Sample.minus`) into ``total``."""
    if not more:
        return
    total["cpu_s"] = total.get("cpu_s", 0.0) + more["cpu_s"]
    total["memory_bytes"] = total.get("memory_bytes", 0) + more["memory_bytes"]
    stats = total.setdefault("commandstats", {})
    for name, v in more["commandstats"].items():
        mine = stats.setdefault(name, {"calls": 0, "usec": 0})
        mine["calls"] += v["calls"]
        mine["usec"] += v["usec"]
    total["commandstats"] = dict(sorted(stats.items(), key=lambda kv: -kv[1]["usec"]))


def run_storm(options: Options) -> dict[str, Any]:
    """Run the storm against every selected store; return the report (``docs/benchmarks.md``)."""
    redis = is_redis_url(options.url)
    replicas = options.replicas if redis else 1
    runnable, unavailable = _stores(options, redis)
    sessions = plan_sessions(
        options.sessions,
        replicas=replicas,
        events=options.events,
        pathology_rate=options.pathology_rate,
        small_retention=options.small_retention,
        seed=options.seed,
    )
    run_id = secrets.token_hex(4)
    report: dict[str, Any] = {
        "meta": storm_meta(options, replicas, redis=redis),
        "stores": [],
        "unavailable": [{"name": n, "reason": why} for n, why in unavailable.items()],
    }
    began = time.monotonic()
    try:
        pooled = _run_rounds(options, runnable, sessions, replicas, run_id, report["meta"])
    except BaseException:
        # Interrupted (Ctrl-C) or failed: the replicas are stopped by now, so
        # nothing writes any more; delete what this run stored on a shared Redis.
        if redis:
            delete_run_keys(options.url, f"{RUN_PREFIX}{run_id}:")
        raise
    for name in runnable:
        entry = CATALOG[name]
        report["stores"].append(_figures(name, entry.what, entry.sticky, pooled[name]))
    report["meta"]["seconds"] = round(time.monotonic() - began, 1)
    report["meta"]["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    report["ratios"] = storm_ratios(report["stores"])
    if options.rounds > 1:
        report["ratios"]["by_round"] = [
            storm_ratios([{"name": s["name"], **s["rounds"][n]} for s in report["stores"]])
            for n in range(options.rounds)
        ]
    report["targets"] = storm_targets(report)
    return report


def _stores(options: Options, redis: bool) -> tuple[list[str], dict[str, str]]:
    """The stores that run here, and why each of the others does not."""
    names = options.stores or default_names(redis)
    cluster = is_cluster_url(options.url)
    unavailable = {
        n: why for n in names if (why := available(n, redis, cluster=cluster)) is not None
    }
    if not options.stores:  # say why a peer is missing (a floor has its twin instead)
        for name in CATALOG:
            if name not in names and not name.startswith("raw"):
                unavailable[name] = available(name, redis, cluster=cluster) or ""
    return [n for n in names if n not in unavailable], unavailable


def _run_rounds(
    options: Options,
    runnable: list[str],
    sessions: list[SessionPlan],
    replicas: int,
    run_id: str,
    meta: dict[str, Any],
) -> dict[str, _Pooled]:
    """Every round of every store on one pool of replica processes; each store's keys deleted."""
    redis = is_redis_url(options.url)
    with (
        asyncio.Runner() as runner,
        Bar(enabled=options.progress) as bar,
        ReplicaPool(_WORKER, replicas, threads=not redis) as pool,
    ):
        probe = RedisProbe(options.url) if redis else None
        try:
            if probe is not None:
                meta["redis"] = runner.run(probe.server())
            pooled = {name: _Pooled() for name in runnable}
            for n in range(options.rounds):
                # alternate the order, so that no store always runs first
                for name in runnable if n % 2 == 0 else runnable[::-1]:
                    spec = StoreSpec(
                        name,
                        options.url,
                        f"{RUN_PREFIX}{run_id}:{name}:",
                        options.retention,
                        options.small_retention,
                    )
                    measure = _Measure(runner, probe if CATALOG[name].backend else None)
                    _run_one(pool, spec, sessions, options, replicas, bar, measure, pooled[name])
                    if probe is not None:
                        runner.run(probe.delete_prefix(spec.prefix))
            return pooled
        finally:
            if probe is not None:
                _close_probe(runner, probe)


def _close_probe(runner: asyncio.Runner, probe: RedisProbe) -> None:
    """Close the probe's connection, also on the way out of a Ctrl-C.

    A Ctrl-C that reaches the runner's loop while it is stopping leaves the
    loop unable to run one more call ("Event loop stopped before Future
    completed"); the connection then goes with the process, and the
    interrupt, not that error, is what the run ends with.
    """
    try:
        runner.run(probe.aclose())
    except RuntimeError as exc:
        if not isinstance(exc.__context__, KeyboardInterrupt):
            raise


class _Measure:
    """Redis samples around a phase (nothing on memory://)."""

    def __init__(self, runner: asyncio.Runner, probe: RedisProbe | None) -> None:
        self._runner = runner
        self._probe = probe

    @contextmanager
    def phase(self, into: dict[str, Any]) -> Iterator[None]:
        before: Sample | None = None
        if self._probe is not None:
            before = self._runner.run(self._probe.sample())
        yield
        if self._probe is not None and before is not None:
            into.update(self._runner.run(self._probe.sample()).minus(before))


@dataclass(slots=True)
class _Fill:
    """What the fill of one round stored and cost."""

    truth: dict[tuple[str, str], list[str]]  # every stream's ids, in append order
    appends: int  # of the measured sessions (the evicted case's are not timed)
    wall: float
    latencies: list[float]
    cost: dict[str, Any]  # Redis figures over the measured part (empty on memory://)


def _run_one(
    pool: ReplicaPool,
    spec: StoreSpec,
    sessions: list[SessionPlan],
    options: Options,
    replicas: int,
    bar: Bar,
    measure: _Measure,
    into: _Pooled,
) -> None:
    """One round of one store: fill, storm, and (the first round only) history, into ``into``."""
    entry = CATALOG[spec.name]
    pool.call_all([("open", spec)] * replicas)
    try:
        fill = _fill(pool, spec.name, sessions, options, replicas, bar, measure)
        reconnects = plan_reconnects(
            sessions,
            fill.truth,
            replicas=replicas,
            share=options.share,
            pathology_rate=options.pathology_rate,
            sticky=entry.sticky,
            seed=options.seed,
        )
        storm_cost: dict[str, Any] = {}
        with bar.task(f"{spec.name}: storm", len(reconnects)) as advance, measure.phase(storm_cost):
            storms = pool.call_all(
                _storm_commands(reconnects, sessions, replicas, options),
                on_progress=advance,
            )
        if not into.rounds:
            with bar.task(f"{spec.name}: history", len(options.sweep)) as advance:
                into.sweep = pool.call_all(
                    [("sweep", {"sizes": options.sweep, "repeats": 21})]
                    + [("idle", None)] * (replicas - 1),
                    on_progress=advance,
                )[0]
    finally:
        pool.call_all([("close", None)] * replicas)
    latencies = _judge_storms(entry.evicts, reconnects, storms, fill.truth, into)
    _pool_round(into, fill, storms, storm_cost, latencies)


def _fill(
    pool: ReplicaPool,
    name: str,
    sessions: list[SessionPlan],
    options: Options,
    replicas: int,
    bar: Bar,
    measure: _Measure,
) -> _Fill:
    """Open every session, then append their events; the evicted case's outside the measure."""
    normal = [s for s in sessions if not s.session.startswith(EVICTED_PREFIX)]
    evicted = [s for s in sessions if s.session.startswith(EVICTED_PREFIX)]
    cost: dict[str, Any] = {}
    total = sum(len(s.streams) * s.events_per_stream for s in sessions)
    _per_replica(pool, "open_sessions", sessions, replicas, options, lambda n: None)
    with bar.task(f"{name}: fill", total) as advance:
        with measure.phase(cost):
            fills = _per_replica(pool, "fill", normal, replicas, options, advance)
        fills += _per_replica(pool, "fill", evicted, replicas, options, advance)
    truth: dict[tuple[str, str], list[str]] = {}
    for f in fills:
        truth.update(f["truth"])
    normal_fills = fills[:replicas]
    return _Fill(
        truth,
        appends=sum(f["appends"] for f in normal_fills),
        wall=max(f["ended"] for f in normal_fills) - min(f["began"] for f in normal_fills),
        latencies=[x for f in normal_fills for x in f["latencies"]],
        cost=cost,
    )


def _judge_storms(
    evicts: bool,
    reconnects: list[Reconnect],
    storms: list[dict[str, Any]],
    truth: dict[tuple[str, str], list[str]],
    into: _Pooled,
) -> list[float]:
    """Judge every answer of the storm against the truth, the storm's appends added to it.

    Tallied into ``into``; returns the resume latencies of this round.
    """
    by_id = {r.id: r for r in reconnects}
    done_at: dict[str, float] = {}
    for s in storms:
        for key, event_id, at in s["appended"]:
            truth[key].append(event_id)
            done_at[event_id] = at
    latencies: list[float] = []
    for s in storms:
        for rid, reply, t0, t1 in s["results"]:
            r = by_id[rid]
            possible = r.possible or (r.kind == "evicted" and not evicts)
            outcome = judge(r, reply, t0, truth[(r.session, r.stream)], done_at, possible=possible)
            into.tally.add(r, reply, outcome, possible=possible)
            latencies.append(t1 - t0)
            into.by_kind.setdefault(r.kind, []).append(t1 - t0)
    return latencies


def _pool_round(
    into: _Pooled,
    fill: _Fill,
    storms: list[dict[str, Any]],
    storm_cost: dict[str, Any],
    latencies: list[float],
) -> None:
    """Add one round's figures to the store's pool, and keep the round's own beside them."""
    storm_wall = max(s["ended"] for s in storms) - min(s["began"] for s in storms)
    storm_appends = sum(len(s["appended"]) for s in storms)
    into.latencies += latencies
    into.storm_wall += storm_wall
    into.replica_cpu_s += sum(s["cpu_s"] for s in storms)
    into.appends += fill.appends
    into.fill_wall += fill.wall
    into.fill_latencies += fill.latencies
    into.storm_appends += storm_appends
    _add_cost(into.fill_cost, fill.cost)
    _add_cost(into.storm_cost, storm_cost)
    failed = [w for s in storms for w in s["failed_writes"]]
    into.failed_writes += failed[: 10 - len(into.failed_writes)]
    this: dict[str, Any] = {
        "resumes": len(latencies),
        "resumes_per_s": round(len(latencies) / storm_wall, 1) if storm_wall > 0 else None,
        "appends_per_s": round(fill.appends / fill.wall, 1) if fill.wall > 0 else None,
        "p50_ms": round(_quantile(sorted(latencies), 0.50) * 1e3, 3),
        "storm_seconds": round(storm_wall, 3),
    }
    if fill.cost:
        this["redis"] = _redis_cost(
            fill.cost,
            storm_cost,
            appends=fill.appends,
            storm_appends=storm_appends,
            resumes=len(latencies),
        )
    into.rounds.append(this)


def _per_replica(
    pool: ReplicaPool,
    command: str,
    sessions: list[SessionPlan],
    replicas: int,
    options: Options,
    advance: Callable[[int], None],
) -> list[Any]:
    shares: list[list[SessionPlan]] = [[] for _ in range(replicas)]
    for s in sessions:
        shares[s.owner].append(s)
    commands = [(command, {"sessions": sh, "concurrency": options.concurrency}) for sh in shares]
    results: list[Any] = pool.call_all(commands, on_progress=advance)
    return results


def _storm_commands(
    reconnects: list[Reconnect], sessions: list[SessionPlan], replicas: int, options: Options
) -> list[tuple[str, dict[str, Any]]]:
    spoiled = {r.session for r in reconnects if r.kind in PATHOLOGIES and r.kind != "second"}
    start_at = time.monotonic() + 0.5
    commands = []
    for i in range(replicas):
        writes = [
            (s.session, stream)
            for s in sessions
            if s.owner == i
            and s.session not in spoiled
            and not s.session.startswith(EVICTED_PREFIX)
            for stream in s.streams
        ]
        commands.append(
            (
                "storm",
                {
                    "reconnects": [r for r in reconnects if r.replica == i],
                    "writes": writes,
                    "rate": options.append_rate / replicas,
                    "writers": options.writers,
                    "concurrency": options.concurrency,
                    "start_at": start_at,
                    "seed": options.seed + i,
                },
            )
        )
    return commands


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _redis_cost(
    fill_cost: dict[str, Any],
    storm_cost: dict[str, Any],
    *,
    appends: int,
    storm_appends: int,
    resumes: int,
) -> dict[str, Any]:
    """Redis CPU per append (over the fill) and per resume (the storm's, less its appends)."""
    cpu_append = fill_cost["cpu_s"] / appends if appends else 0.0
    storm_cpu = storm_cost["cpu_s"] - storm_appends * cpu_append
    cpu_resume = storm_cpu / resumes if resumes else 0.0
    return {
        "cpu_us_per_append": round(cpu_append * 1e6, 2),
        "cpu_us_per_resume": round(cpu_resume * 1e6, 2),
        "resumes_per_redis_cpu_s": round(1 / cpu_resume, 1) if cpu_resume > 0 else None,
    }


def _figures(name: str, what: str, sticky: bool, p: _Pooled) -> dict[str, Any]:
    lat = sorted(p.latencies)
    resumes = len(lat)
    out: dict[str, Any] = {
        "name": name,
        "what": what,
        "routing": "sticky (the writer's replica)" if sticky else "another replica than the writer",
        "resumes": resumes,
        "resumes_per_s": round(resumes / p.storm_wall, 1) if p.storm_wall > 0 else None,
        "p50_ms": round(_quantile(lat, 0.50) * 1e3, 3),
        "p99_ms": round(_quantile(lat, 0.99) * 1e3, 3),
        "p999_ms": round(_quantile(lat, 0.999) * 1e3, 3),
        "appends": p.appends,
        "appends_per_s": round(p.appends / p.fill_wall, 1) if p.fill_wall > 0 else None,
        "append_p50_ms": round(statistics.median(p.fill_latencies) * 1e3, 3)
        if p.fill_latencies
        else None,
        "storm_appends": p.storm_appends,
        "storm_seconds": round(p.storm_wall, 3),
        # every replica process's CPU over the storm per resume (the few appends included)
        "replica_cpu_us_per_resume": round(p.replica_cpu_s * 1e6 / resumes, 1) if resumes else None,
        **p.tally.as_dict(),
        "latency_cdf_ms": [round(_quantile(lat, q / 100) * 1e3, 3) for q in range(101)],
        # a failed resume does more than a good one: what that costs its caller
        "latency_ms_by_kind": {
            kind: {
                "p50": round(_quantile(sorted(values), 0.50) * 1e3, 3),
                "p99": round(_quantile(sorted(values), 0.99) * 1e3, 3),
            }
            for kind, values in sorted(p.by_kind.items())
        },
        "resume_by_history": p.sweep,
    }
    if p.fill_cost:
        cost = _redis_cost(
            p.fill_cost,
            p.storm_cost,
            appends=p.appends,
            storm_appends=p.storm_appends,
            resumes=resumes,
        )
        out["redis"] = {
            **cost,
            "bytes_per_event": round(p.fill_cost["memory_bytes"] / p.appends, 1)
            if p.appends
            else None,
            # Redis CPU seconds per wall second of the storm: near 1, Redis is the limit.
            "storm_busy": round(p.storm_cost["cpu_s"] / p.storm_wall, 3) if p.storm_wall else None,
            "fill": p.fill_cost,
            "storm": p.storm_cost,
        }
    if len(p.rounds) > 1:
        out["rounds"] = p.rounds
    if p.failed_writes:
        out["failed_writes"] = p.failed_writes
    return out


def storm_meta(options: Options, replicas: int, *, redis: bool) -> dict[str, Any]:
    """What a report says about the run: options, machine, package versions."""
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    opts = asdict(options)
    opts["replicas"] = replicas
    opts.pop("progress")
    return {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "options": opts,
        "backend": ("redis cluster" if is_cluster_url(options.url) else "redis")
        if redis
        else "memory",
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "packages": {
            d: version(d)
            for d in (
                "replaystore",
                "redis",
                "hiredis",
                "fastmcp",
                "py-key-value-aio",
                "mcp",
                "mcp-persist",
            )
        },
    }

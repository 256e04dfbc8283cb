"""The storm's report as a markdown table (stdout, and ``docs/benchmarks.md``)."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown"]


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(report: dict[str, Any]) -> str:
    if report["meta"].get("http"):
        return _http_markdown(report)
    meta = report["meta"]
    opts = meta["options"]
    lines = [
        f"Reconnect storm: {opts['sessions']:,} sessions, {opts['replicas']} replica "
        f"process(es), {meta['backend']} backend, {meta['machine']['cpu_count']} CPUs, "
        f"{meta['seconds']} s; {opts['share']:.0%} of the sessions reconnect at once, "
        f"{opts['pathology_rate']:.0%} of the sessions with a pathological reconnect "
        f"({', '.join(_pathologies(report))}); load average {meta['machine']['load_average']} "
        "at the start",
        *_rounds(report),
        "",
        "| store | resumes/s | p50 ms | p99 ms | p999 ms | appends/s "
        "| Redis CPU µs/resume | µs/append | resumes per Redis CPU-s | bytes/event "
        "| reconnects | exact | dup | loss | wrong stream | failures (correct/incorrect) "
        "| incorrect verdicts |",
        "|---|" + "---:|" * 16,
    ]
    for s in report["stores"]:
        redis = s.get("redis", {})
        lines.append(
            f"| {s['name']} | {_num(s['resumes_per_s'])} | {_num(s['p50_ms'], 2)} "
            f"| {_num(s['p99_ms'], 2)} | {_num(s['p999_ms'], 2)} | {_num(s['appends_per_s'])} "
            f"| {_num(redis.get('cpu_us_per_resume'), 1)} "
            f"| {_num(redis.get('cpu_us_per_append'), 1)} "
            f"| {_num(redis.get('resumes_per_redis_cpu_s'))} "
            f"| {_num(redis.get('bytes_per_event'))} | {_num(s['reconnects'])} "
            f"| {_num(s['exact'])} | {_num(s['duplicates'])} | {_num(s['losses'])} "
            f"| {_num(s['wrong_stream'])} "
            f"| {_num(s['correct_failures'])}/{_num(s['incorrect_failures'])} "
            f"| {_num(s['incorrect_verdicts'])} |"
        )
    for u in report["unavailable"]:
        lines.append(f"| {u['name']} | not run: {u['reason']} |" + " |" * 15)
    kinds = _kinds(report)
    if kinds:
        lines += ["", "Outcomes by kind of reconnect (exact/dup/loss/wrong/failed):", ""]
        lines += kinds
    lines += _targets(report)
    return "\n".join(lines)


def _rounds(report: dict[str, Any]) -> list[str]:
    """With ``--rounds``: what the figures pool, and each round's ratios (their spread)."""
    rounds = report["meta"]["options"].get("rounds", 1)
    by_round = report.get("ratios", {}).get("by_round")
    if rounds <= 1 or not by_round:
        return []
    lines = [
        "",
        f"Each store filled and stormed {rounds} times, the stores' order alternating; the "
        "table pools the rounds (counts and seconds added, latencies merged). replaystore "
        "against the floor, round by round:",
        "",
    ]
    for key, label in (
        ("resumes_per_s_vs_floor", "resumes/s"),
        ("redis_cpu_per_resume_vs_floor", "Redis CPU per resume"),
        ("redis_cpu_per_append_vs_floor", "Redis CPU per append"),
    ):
        values = [r.get(key) for r in by_round]
        if any(v is not None for v in values):
            lines.append(f"- {label}: " + ", ".join(f"{_num(v, 2)}x" for v in values))
    return lines


def _kinds(report: dict[str, Any]) -> list[str]:
    stores = report["stores"]
    if not stores:
        return []
    kinds = sorted({k for s in stores for k in s["outcomes_by_kind"]})
    lines = ["| store | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for s in stores:
        cells = []
        for k in kinds:
            c = s["outcomes_by_kind"].get(k, {})
            failed = c.get("correct_failure", 0) + c.get("incorrect_failure", 0)
            cells.append(
                f"{c.get('exact', 0)}/{c.get('duplicate', 0)}/{c.get('loss', 0)}"
                f"/{c.get('wrong_stream', 0)}/{failed}"
            )
        lines.append(f"| {s['name']} | " + " | ".join(cells) + " |")
    return lines


def _pathologies(report: dict[str, Any]) -> list[str]:
    kinds = {k for s in report["stores"] for k in s["outcomes_by_kind"]}
    return sorted(kinds - {"normal"})


def _http_markdown(report: dict[str, Any]) -> str:
    """The end-to-end table: one row per store and routing, its replicas' CPU next to Redis's."""
    meta = report["meta"]
    opts = meta["options"]
    killed = (
        " One replica killed (SIGKILL) half-way through each storm."
        if meta.get("kill_replica")
        else ""
    )
    lines = [
        f"Reconnect storm over MCP HTTP: {opts['sessions']:,} sessions, {opts['replicas']} "
        f"server replicas per store, {meta['machine']['cpu_count']} CPUs, {meta['seconds']} s; "
        f"every client reconnects at once, {opts['pathology_rate']:.0%} of them with another "
        f"session's cursor or one no replica issued; load average "
        f"{meta['machine']['load_average']} at the start.{killed}",
        "",
        "| store | routing | all clients back (s) | resumes/s | p50 ms | p99 ms | p999 ms "
        "| replica CPU µs/resume | Redis CPU µs/resume | exact | dup | loss | wrong stream "
        "| failures (correct/incorrect) | incorrect verdicts |",
        "|---|---|" + "---:|" * 13,
    ]
    for s in report["stores"]:
        redis = s.get("redis", {})
        lines.append(
            f"| {s['name']} | {s['routing']} | {_num(s['recovery_s'], 2)} "
            f"| {_num(s['resumes_per_s'])} | {_num(s['p50_ms'], 1)} | {_num(s['p99_ms'], 1)} "
            f"| {_num(s['p999_ms'], 1)} | {_num(s['replica_cpu_us_per_resume'])} "
            f"| {_num(redis.get('cpu_us_per_resume'), 1) if redis else 'in process'} "
            f"| {_num(s['exact'])} | {_num(s['duplicates'])} | {_num(s['losses'])} "
            f"| {_num(s['wrong_stream'])} "
            f"| {_num(s['correct_failures'])}/{_num(s['incorrect_failures'])} "
            f"| {_num(s['incorrect_verdicts'])} |"
        )
    for u in report["unavailable"]:
        lines.append(f"| {u['name']} | not run: {u['reason']} |" + " |" * 13)
    retried = [
        f"{s['name']} {s['setup_retries']}" for s in report["stores"] if s.get("setup_retries")
    ]
    if retried:
        lines += ["", "Sessions started over after a 503 during setup: " + ", ".join(retried) + "."]
    kinds = _kinds(report)
    if kinds:
        lines += ["", "Outcomes by kind of reconnect (exact/dup/loss/wrong/failed):", ""]
        lines += kinds
    lines += _targets(report)
    return "\n".join(lines)


def _targets(report: dict[str, Any]) -> list[str]:
    """The figures replaystore promises in this run, each with its value and whether it is met."""
    if not report.get("targets"):
        return []
    lines = ["", "| replaystore figure | target | measured | met |", "|---|---|---:|---|"]
    for t in report["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['figure']} | {t['target']} | {_num(t['value'], 2)} | {met} |")
    return lines

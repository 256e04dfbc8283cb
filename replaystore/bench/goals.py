"""What the storm promises for replaystore, computed from each run against its yardsticks.

The bare storm measures against the raw floor (Redis streams, no checks), the
HTTP storm against the official SDK's example store behind sticky routing:
ratios within one run, never absolute figures of one machine.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BASELINE", "http_ratios_and_targets", "storm_ratios", "storm_targets"]


def storm_ratios(stores: list[dict[str, Any]]) -> dict[str, Any]:
    by = {s["name"]: s for s in stores}
    rs = by.get("replaystore")
    raw = next((s for s in stores if s["name"].startswith("raw")), None)
    if rs is None or raw is None:
        return {}
    out: dict[str, Any] = {"floor": raw["name"]}
    if rs["resumes_per_s"] and raw["resumes_per_s"]:
        out["resumes_per_s_vs_floor"] = round(rs["resumes_per_s"] / raw["resumes_per_s"], 3)
    if rs["appends_per_s"] and raw["appends_per_s"]:
        out["appends_per_s_vs_floor"] = round(rs["appends_per_s"] / raw["appends_per_s"], 3)
    if "redis" in rs and "redis" in raw and raw["redis"]["cpu_us_per_resume"] > 0:
        out["redis_cpu_per_resume_vs_floor"] = round(
            rs["redis"]["cpu_us_per_resume"] / raw["redis"]["cpu_us_per_resume"], 3
        )
        if rs["redis"]["cpu_us_per_resume"] > 0:
            out["resumes_per_redis_cpu_s_vs_floor"] = round(
                raw["redis"]["cpu_us_per_resume"] / rs["redis"]["cpu_us_per_resume"], 3
            )
        if raw["redis"]["cpu_us_per_append"] > 0:
            out["redis_cpu_per_append_vs_floor"] = round(
                rs["redis"]["cpu_us_per_append"] / raw["redis"]["cpu_us_per_append"], 3
            )
    return out


def storm_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures replaystore promises, each with its value and whether it was met."""
    rs = next((s for s in report["stores"] if s["name"] == "replaystore"), None)
    if rs is None:
        return []
    ratios = report["ratios"]
    rows: list[tuple[str, str, Any, bool | None]] = [
        ("duplicates", "0", rs["duplicates"], rs["duplicates"] == 0),
        ("losses", "0", rs["losses"], rs["losses"] == 0),
        ("wrong_stream", "0", rs["wrong_stream"], rs["wrong_stream"] == 0),
        ("incorrect_verdicts", "0", rs["incorrect_verdicts"], rs["incorrect_verdicts"] == 0),
    ]

    def ratio(key: str, label: str, bound: float, at_least: bool) -> None:
        value = ratios.get(key)
        met = None if value is None else (value >= bound if at_least else value <= bound)
        rows.append((label, f"{'>=' if at_least else '<='} {bound}x", value, met))

    ratio("resumes_per_s_vs_floor", "resumes/s vs the raw floor", 0.8, True)
    ratio("redis_cpu_per_resume_vs_floor", "Redis CPU per resume vs the raw floor", 1.8, False)
    return [{"figure": f, "target": t, "value": v, "met": m} for f, t, v, m in rows]


#: The HTTP storm's yardstick: the official SDK's example store behind sticky
#: routing, the smallest deployment people run today.
BASELINE = "sdk-example (sticky)"


def http_ratios_and_targets(
    rows: list[dict[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """replaystore round robin against the SDK's store with sticky routing, in this run.

    The fleet is back when every client has its missed events or its 404
    (``recovery_s``); the CPU is the server replicas' own per resume. Exactness
    is asked of both replaystore rows.
    """
    by = {r["name"]: r for r in rows}
    rs, base = by.get("replaystore (round-robin)"), by.get(BASELINE)
    ratios: dict[str, Any] = {}
    if rs is not None and base is not None:
        ratios["baseline"] = BASELINE
        if rs["recovery_s"] and base["recovery_s"]:
            ratios["recovery_vs_sdk"] = round(rs["recovery_s"] / base["recovery_s"], 3)
        rs_cpu, base_cpu = rs["replica_cpu_us_per_resume"], base["replica_cpu_us_per_resume"]
        if rs_cpu and base_cpu:
            ratios["replica_cpu_per_resume_vs_sdk"] = round(rs_cpu / base_cpu, 3)
    targets: list[dict[str, Any]] = []
    for name in ("replaystore (round-robin)", "replaystore (sticky)"):
        row = by.get(name)
        if row is None:
            continue
        for figure in ("duplicates", "losses", "wrong_stream"):
            value = row[figure]
            targets.append(
                {"figure": f"{name}: {figure}", "target": "0", "value": value, "met": value == 0}
            )
    for key, label, bound in (
        ("recovery_vs_sdk", "time until every client is back vs the SDK's store (sticky)", 1.1),
        (
            "replica_cpu_per_resume_vs_sdk",
            "replica CPU per resume vs the SDK's store (sticky)",
            1.2,
        ),
    ):
        value = ratios.get(key)
        targets.append(
            {
                "figure": f"replaystore (round-robin): {label}",
                "target": f"<= {bound}x",
                "value": value,
                "met": None if value is None else value <= bound,
            }
        )
    return ratios, targets

"""PNG plots of a storm report (matplotlib, no display needed).

- ``latency_cdf.png``: resume latency CDF per store;
- ``throughput.png``: resumes/s and appends/s per store;
- ``cost_by_history.png``: the latency of one 9-event resume (one caller, no other
  load) against the number of events the session holds in another stream (not
  written for a run that measured none, such as ``--http``).

An axis is logarithmic only when every value on it is positive: a latency that
rounds to 0 ms would make matplotlib refuse the whole plot.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["write_plots"]


def write_plots(report: dict[str, Any], directory: Path) -> list[Path]:
    """Write the plots into ``directory``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    stores = report["stores"]
    title = (
        f"{report['meta']['options']['sessions']:,} sessions, "
        f"{report['meta']['options']['replicas']} replica(s), {report['meta']['backend']}"
    )
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.2))
    latencies = []
    for s in stores:
        xs = s["latency_cdf_ms"]
        ax.plot(xs, [q / 100 for q in range(len(xs))], label=s["name"])
        latencies += xs
    log = _loggable(latencies)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("resume latency (ms, log)" if log else "resume latency (ms)")
    ax.set_ylabel("fraction of resumes")
    ax.set_title(f"Resume latency CDF: {title}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, directory / "latency_cdf.png"))

    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = [s["name"] for s in stores]
    width = 0.4
    xs = list(range(len(names)))
    ax.bar(
        [x - width / 2 for x in xs],
        [s["resumes_per_s"] or 0 for s in stores],
        width,
        label="resumes/s",
    )
    ax.bar(
        [x + width / 2 for x in xs],
        [s["appends_per_s"] or 0 for s in stores],
        width,
        label="appends/s",
    )
    ax.set_xticks(xs, names, rotation=20, fontsize=8)
    ax.set_ylabel("per second")
    ax.set_title(f"Throughput: {title}", fontsize=10)
    ax.legend(fontsize=8)
    paths.append(_save(fig, directory / "throughput.png"))

    curves = {
        s["name"]: sorted((int(k), v["p50_ms"]) for k, v in s["resume_by_history"].items())
        for s in stores
    }
    curves = {name: points for name, points in curves.items() if points}
    if not curves:
        return paths
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in curves.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    every = [p for points in curves.values() for p in points]
    x_log, y_log = _loggable([p[0] for p in every]), _loggable([p[1] for p in every])
    if x_log:
        ax.set_xscale("log")
    if y_log:
        ax.set_yscale("log")
    ax.set_xlabel("events of the session's other stream" + (" (log)" if x_log else ""))
    ax.set_ylabel("median latency of a 9-event resume (ms" + (", log)" if y_log else ")"))
    ax.set_title(f"Resume cost against history size: {title}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, directory / "cost_by_history.png"))
    return paths


def _loggable(values: list[float]) -> bool:
    finite = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return bool(finite) and min(finite) > 0


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

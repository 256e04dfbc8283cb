"""PNG plots of a storm report (matplotlib, no display needed).

- ``latency_cdf.png``: resume latency CDF per store;
- ``throughput.png``: resumes/s and appends/s per store (appends/s only where measured);
- ``cpu_per_resume.png``: CPU per resume per store: the Redis's (``INFO``) for a
  store on Redis, and the replica processes' (the storm's, or over HTTP the
  servers'); a store in process memory has no Redis bar, it is labelled "in
  process" instead;
- ``cost_by_history.png``: the latency of one 9-event resume (one caller, no other
  load) against the number of events the session holds in another stream (not
  written for a run that measured none, such as ``--http``).

An axis is logarithmic only when every value on it is positive: a latency that
rounds to 0 ms would make matplotlib refuse the whole plot. A bar chart's
axis is logarithmic when its bars span more than 30x (:func:`wide`): one
in-process peer's hundreds of thousands of appends/s would flatten the rest.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["cpu_series", "write_plots"]


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
        points = [(x, q / 100) for q, x in enumerate(s["latency_cdf_ms"]) if _finite(x)]
        if not points:  # nothing resumed: no curve
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], label=s["name"])
        latencies += [p[0] for p in points]
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
    if any(s["appends_per_s"] for s in stores):  # not measured over HTTP
        ax.bar(
            [x + width / 2 for x in xs],
            [s["appends_per_s"] or 0 for s in stores],
            width,
            label="appends/s",
        )
    ax.set_xticks(xs, names, rotation=20, fontsize=8)
    rates = [(key, [s[key] or None for s in stores]) for key in ("resumes_per_s", "appends_per_s")]
    if wide(rates):
        ax.set_yscale("log")
    ax.set_ylabel("per second")
    ax.set_title(f"Throughput: {title}", fontsize=10)
    ax.legend(fontsize=8)
    paths.append(_save(fig, directory / "throughput.png"))

    cpu = _cpu_plot(stores, title, directory)
    if cpu is not None:
        paths.append(cpu)

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


def cpu_series(stores: list[dict[str, Any]]) -> list[tuple[str, list[float | None]]]:
    """The bars of ``cpu_per_resume.png``: ``(label, value per store)``, None where not measured.

    A store in process memory has no Redis figure, so it gets no Redis bar
    (None), never a zero that would read as a free Redis; a series nobody
    measured is left out.
    """
    redis = [s.get("redis", {}).get("cpu_us_per_resume") for s in stores]
    replicas = [s.get("replica_cpu_us_per_resume") for s in stores]
    return [
        (label, [v if _finite(v) else None for v in values])
        for label, values in (("replica processes", replicas), ("Redis", redis))
        if any(_finite(v) for v in values)
    ]


def wide(series: list[tuple[str, list[float | None]]]) -> bool:
    """Whether the bars span more than 30x: then a log axis, or one slow peer flattens the rest."""
    values = [v for _, row in series for v in row if v is not None]
    return _loggable(values) and max(values) > 30 * min(values)


def _cpu_plot(stores: list[dict[str, Any]], title: str, directory: Path) -> Path | None:
    """CPU µs per resume: Redis's bar only for a store on Redis, replicas' bar over HTTP."""
    import matplotlib.pyplot as plt

    series = cpu_series(stores)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / len(series)
    xs = list(range(len(stores)))
    for k, (label, values) in enumerate(series):
        offset = (k - (len(series) - 1) / 2) * width
        drawn = [(x + offset, v) for x, v in zip(xs, values, strict=True) if v is not None]
        ax.bar(
            [x for x, _ in drawn],
            [v for _, v in drawn],
            width,
            label=f"{label} CPU",
        )
    names = [s["name"] + ("\n(in process)" if "redis" not in s else "") for s in stores]
    ax.set_xticks(xs, names, rotation=20, fontsize=8)
    if wide(series):
        ax.set_yscale("log")
    ax.set_ylabel("CPU µs per resume")
    ax.set_title(f"CPU per resume: {title}", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, directory / "cpu_per_resume.png")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _loggable(values: list[float]) -> bool:
    finite = [v for v in values if _finite(v)]
    return bool(finite) and min(finite) > 0


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

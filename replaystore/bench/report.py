"""What a storm shows its user: its progress, the markdown table, PNG plots.

The progress goes to stderr while the storm runs (a rich bar on a terminal,
plain lines elsewhere), so stdout keeps only the table (the tables of
``docs/benchmarks.md``). The plots (matplotlib, no display needed, 1,200 x
720 pixels):

- ``latency_cdf.png``: resume latency CDF per store;
- ``throughput.png``: resumes/s and appends/s per store (appends/s only where
  measured), beside the share of its reconnects each store answered wrong
  (lost, duplicated, wrong stream, refused where it could resume), so that a
  fast store that answers wrong never looks good;
- ``cpu_per_resume.png``: CPU per resume per store: the Redis's (``INFO``) for a
  store on Redis, and the replica processes' (the storm's, or over HTTP the
  servers'); a store in process memory has no Redis bar, it is labelled "in
  process" instead;
- ``cost_by_history.png``: the latency of one 9-event resume (one caller, no other
  load) against the number of events the session holds in another stream (not
  written for a run that measured none, such as ``--http``).

Every plot names a store that answered any reconnect wrong as such ("3 of
18 wrong") in its legend or under its bar.

The table is followed by what each column means. A run too short to compare
speed (fewer than :data:`MIN_RESUMES` resumes for some store) gets a line
saying so above it, and its speed targets are left unjudged; a run of one
round gets a line saying its ratios are one storm's.

An axis is logarithmic only when every value on it is positive: a latency that
rounds to 0 ms would make matplotlib refuse the whole plot. A bar chart's
axis is logarithmic when its bars span more than 30x (:func:`wide`): one
in-process peer's hundreds of thousands of appends/s would flatten the rest.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

__all__ = [
    "MIN_RESUMES",
    "WRONG",
    "Bar",
    "cpu_series",
    "markdown",
    "too_short",
    "wide",
    "write_plots",
    "wrong",
]

#: Fewer resumes than this for a store: its rates, latencies, CPU and their
#: ratios are noise (a store's figures move by tens of percent between such
#: runs); its counts of wrong answers are not.
MIN_RESUMES = 1000

#: Plot size in inches and resolution: 1,200 x 720 pixels.
FIGSIZE = (10.0, 6.0)
DPI = 120


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
        *_short(report),
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
    lines += _legend(_STORM_COLUMNS, kinds=bool(kinds))
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
    before = len(lines)
    for key, label in (
        ("resumes_per_s_vs_floor", "resumes/s"),
        ("redis_cpu_per_resume_vs_floor", "Redis CPU per resume"),
        ("redis_cpu_per_append_vs_floor", "Redis CPU per append"),
    ):
        values = [r.get(key) for r in by_round]
        if any(v is not None for v in values):
            lines.append(f"- {label}: " + ", ".join(_ratio(v) for v in values))
    if len(lines) == before:
        lines.append("- none measured: replaystore and the floor (raw-*) did not both run")
    return lines


def _ratio(value: float | None) -> str:
    return "not measured" if value is None else f"{_num(value, 2)}x"


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
        *_short(report),
        *_http_rounds(report),
        "",
        "| store | routing | all clients back (s) | resumes/s | p50 ms | p99 ms | p999 ms "
        "| replica CPU µs/resume | vs floor | Redis CPU µs/resume | exact | dup | loss "
        "| wrong stream | failures (correct/incorrect) | incorrect verdicts |",
        "|---|---|" + "---:|" * 14,
    ]
    vs_floor = report.get("ratios", {}).get("replica_cpu_per_resume_vs_floor", {})
    for s in report["stores"]:
        redis = s.get("redis", {})
        floor = vs_floor.get(s["name"])
        lines.append(
            f"| {s['name']} | {s['routing']} | {_num(s['recovery_s'], 2)} "
            f"| {_num(s['resumes_per_s'])} | {_num(s['p50_ms'], 1)} | {_num(s['p99_ms'], 1)} "
            f"| {_num(s['p999_ms'], 1)} | {_num(s['replica_cpu_us_per_resume'])} "
            f"| {'-' if floor is None else f'{floor:.2f}x'} "
            f"| {_num(redis.get('cpu_us_per_resume'), 1) if redis else 'in process'} "
            f"| {_num(s['exact'])} | {_num(s['duplicates'])} | {_num(s['losses'])} "
            f"| {_num(s['wrong_stream'])} "
            f"| {_num(s['correct_failures'])}/{_num(s['incorrect_failures'])} "
            f"| {_num(s['incorrect_verdicts'])} |"
        )
    for u in report["unavailable"]:
        lines.append(f"| {u['name']} | not run: {u['reason']} |" + " |" * 14)
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
    lines += _legend(_HTTP_COLUMNS, kinds=bool(kinds))
    return "\n".join(lines)


def _http_rounds(report: dict[str, Any]) -> list[str]:
    """With ``--rounds``: what a row's figures are, and the promised ratios round by round."""
    rounds = report["meta"]["options"].get("rounds", 1)
    if rounds <= 1:
        return []
    lines = [
        "",
        f"Each store stormed {rounds} times, on server processes started for each storm, the "
        "stores' order rotated every round; a row's figures are the medians over the rounds, "
        "its counts (exact, dup, loss, wrong stream, failures) their sums.",
    ]
    by_round = report.get("ratios", {}).get("by_round")
    if by_round:
        lines += ["", "Replica CPU per resume, round by round:", ""]
        for pair in by_round[0]:
            values = [r.get(pair) for r in by_round]
            lines.append(f"- {pair}: " + ", ".join(_ratio(v) for v in values))
    return lines


def _targets(report: dict[str, Any]) -> list[str]:
    """The figures replaystore promises in this run, each with its value and whether it is met."""
    if not report.get("targets"):
        return []
    short = too_short(report) is not None
    lines = ["", "| replaystore figure | target | measured | met |", "|---|---|---:|---|"]
    for t in report["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        if short and t["met"] is not None and t["target"].endswith("x"):
            met = "too short to judge"  # a speed ratio of a short run; counts stay judged
        lines.append(f"| {t['figure']} | {t['target']} | {_num(t['value'], 2)} | {met} |")
    return lines


def too_short(report: dict[str, Any]) -> str | None:
    """Why this run's speed cannot be judged (its rates and ratios are noise), or ``None``."""
    resumes = [s.get("resumes") or 0 for s in report["stores"]]
    if not resumes or min(resumes) >= MIN_RESUMES:
        return None
    return f"{min(resumes):,} resumes for the store with the fewest (fewer than {MIN_RESUMES:,})"


def _short(report: dict[str, Any]) -> list[str]:
    """The warning a run too short to judge gets, or the one a single round gets."""
    why = too_short(report)
    if why is not None:
        return [
            "",
            f"**Too short to judge speed**: {why}. On so short a run the rates, latencies, "
            "CPU and their ratios move between runs by more than the stores differ, so the "
            "speed targets below are not judged; the counts of wrong answers (dup, loss, wrong "
            "stream, incorrect verdicts) hold at any length. To compare speed: --sessions "
            "10000 --rounds 3.",
        ]
    if report["meta"]["options"].get("rounds", 1) <= 1:
        return [
            "",
            "One round: a ratio of one storm moves by tens of percent between runs on a shared "
            "machine; --rounds 3 shows the spread.",
        ]
    return []


#: What each column of the tables means, in the order they appear.
_COMMON_COLUMNS = (
    ("p50 ms, p99 ms, p999 ms", "one resume's latency (request to its last event), percentiles"),
    ("exact", "reconnects given exactly the events the client missed, in order"),
    ("dup", "reconnects given an event the client already had"),
    (
        "loss",
        "reconnects told they were in step while events they needed were missing "
        "(a silent gap), including a success on a cursor no store can resume from",
    ),
    ("wrong stream", "reconnects given an event of another stream or another session"),
    (
        "failures (correct/incorrect)",
        "reconnects refused: where no exact resume was possible (correct), or where it was "
        "(incorrect)",
    ),
    ("incorrect verdicts", "reconnects whose yes or no was wrong (loss by a success included)"),
)
_STORM_COLUMNS = (
    ("resumes/s", "reconnects answered per second of the storm, all replicas together"),
    *_COMMON_COLUMNS[:1],
    ("appends/s", "events stored per second while the sessions filled up"),
    ("Redis CPU µs/resume", "Redis's own CPU (INFO) over the storm, less its appends, per resume"),
    ("µs/append", "Redis's own CPU over the fill, per event stored"),
    ("resumes per Redis CPU-s", "resumes one second of Redis CPU serves"),
    ("bytes/event", "Redis memory the fill added, per event stored"),
    ("reconnects", "reconnects judged: the sum of the outcomes after it"),
    *_COMMON_COLUMNS[1:],
    (
        "floor",
        "raw-streams / raw-memory: the same appends and reads with no checks (one Redis "
        "stream or list per SSE stream), the least a store can cost; replaystore is measured "
        "against it",
    ),
)
_HTTP_COLUMNS = (
    ("routing", "sticky: each client back on its own replica; round-robin: on any replica"),
    ("all clients back (s)", "from the storm's start until every client has its events or a 404"),
    ("resumes/s", "reconnects answered per second of that time"),
    *_COMMON_COLUMNS[:1],
    ("replica CPU µs/resume", "the server replicas' CPU over the storm, per resume"),
    (
        "vs floor",
        "replica CPU per resume over the floor's; the floor (sticky) is a bare ASGI app "
        "serving the same requests with one Redis read per resume and no checks, the least a "
        "Python server can do",
    ),
    ("Redis CPU µs/resume", "Redis's own CPU (INFO) over the storm, per resume"),
    *_COMMON_COLUMNS[1:],
)
_KINDS = (
    "Kinds of reconnect: normal (the stream the client read, from an event it saw); second (a "
    "second connection with the same cursor at once); conflated (the GET stream resumed with a "
    "tool call's cursor: one Last-Event-ID slot, two streams); evicted (the cursor fell out of "
    "retention); ahead (a cursor past anything the store issued); foreign (another session's "
    "cursor). Only normal and second can resume; for the others the right answer is a refusal."
)


def _legend(columns: tuple[tuple[str, str], ...], *, kinds: bool) -> list[str]:
    lines = ["", "Columns:", ""]
    lines += [f"- {name}: {meaning}." for name, meaning in columns]
    return [*lines, "", _KINDS] if kinds else lines


# -- the progress bar ---------------------------------------------------------------

#: Seconds between two progress lines of one phase when stderr is not a terminal.
LINE_EVERY = 10.0


class Bar:
    """Progress on stderr, one bar per phase; plain lines when stderr is not a terminal.

    On a terminal (with rich, which the bench extra brings) each phase is a
    live bar. Anywhere else (a CI log, ``2> file``, a pipe) each phase prints
    a line when it starts, one every :data:`LINE_EVERY` seconds while it
    runs, and one when it ends, so a long run in a log still shows it is
    alive and how far it got. ``stream``: where to write (``sys.stderr`` by
    default, looked up when the bar is made).
    """

    def __init__(self, *, enabled: bool, stream: TextIO | None = None) -> None:
        self._progress: Any = None
        self._lines: TextIO | None = None
        if not enabled:
            return
        out = sys.stderr if stream is None else stream
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )
        except ImportError:  # the bench extra brings rich; without it, lines
            self._lines = out
            return
        console = Console(file=out)
        if not console.is_terminal:
            self._lines = out
            return
        self._progress = Progress(
            TextColumn("{task.description:<24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )

    def __enter__(self) -> Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextmanager
    def task(self, label: str, total: int) -> Iterator[Callable[[int], None]]:
        if self._lines is not None:
            with self._line_task(self._lines, label, total) as step:
                yield step
            return
        if self._progress is None:
            yield lambda n: None
            return
        task_id = self._progress.add_task(label, total=total)

        def advance(n: int) -> None:
            self._progress.advance(task_id, n)

        yield advance
        self._progress.update(task_id, completed=total)

    @staticmethod
    @contextmanager
    def _line_task(out: TextIO, label: str, total: int) -> Iterator[Callable[[int], None]]:
        began = last = time.monotonic()
        done = 0

        def say(text: str) -> None:
            print(f"{label}: {text}", file=out, flush=True)

        def advance(n: int) -> None:
            nonlocal done, last
            done += n
            now = time.monotonic()
            if now - last >= LINE_EVERY:
                last = now
                say(f"{done:,}/{total:,} after {now - began:.0f} s")

        say(f"0/{total:,}")
        yield advance
        say(f"{total:,}/{total:,} in {time.monotonic() - began:.1f} s")


# -- the plots ------------------------------------------------------------------------


def write_plots(report: dict[str, Any], directory: Path) -> list[Path]:
    """Write the plots into ``directory``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")

    directory.mkdir(parents=True, exist_ok=True)
    stores = report["stores"]
    title = (
        f"{report['meta']['options']['sessions']:,} sessions, "
        f"{report['meta']['options']['replicas']} replica(s), {report['meta']['backend']}"
    )
    drawn = [
        _latency_plot(stores, title, directory),
        _throughput_plot(stores, title, directory),
        _cpu_plot(stores, title, directory),
        _history_plot(stores, title, directory),
    ]
    return [path for path in drawn if path is not None]


def _latency_plot(stores: list[dict[str, Any]], title: str, directory: Path) -> Path:
    """The resume latency CDF, one curve per store that resumed anything."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=FIGSIZE)
    latencies = []
    for s in stores:
        points = [(x, q / 100) for q, x in enumerate(s["latency_cdf_ms"]) if _finite(x)]
        if not points:  # nothing resumed: no curve
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], label=_label(s))
        latencies += [p[0] for p in points]
    log = _loggable(latencies)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("resume latency (ms, log)" if log else "resume latency (ms)")
    ax.set_ylabel("fraction of resumes")
    ax.set_title(f"Resume latency CDF: {title}", fontsize=12)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    return _save(fig, directory / "latency_cdf.png")


def _throughput_plot(stores: list[dict[str, Any]], title: str, directory: Path) -> Path:
    """Speed (resumes/s, appends/s where measured) beside the share of wrong answers.

    The speed bars of a store that answered any reconnect wrong are hatched
    and its tick says how many: speed bought with wrong answers is no speed.
    """
    import matplotlib.pyplot as plt

    fig, (speed, truth) = plt.subplots(
        1, 2, figsize=(FIGSIZE[0] * 1.4, FIGSIZE[1]), gridspec_kw={"width_ratios": [3, 2]}
    )
    names = [_label(s, "\n") for s in stores]
    width = 0.4
    xs = list(range(len(names)))
    speed.bar(
        [x - width / 2 for x in xs],
        [s["resumes_per_s"] or 0 for s in stores],
        width,
        label="resumes/s",
    )
    if any(s["appends_per_s"] for s in stores):  # not measured over HTTP
        speed.bar(
            [x + width / 2 for x in xs],
            [s["appends_per_s"] or 0 for s in stores],
            width,
            label="appends/s",
        )
    for container in speed.containers:  # a store that answers wrong: its speed struck through
        for patch, s in zip(container.patches, stores, strict=True):
            if wrong(s):
                patch.set_hatch("xx")
                patch.set_edgecolor("tab:red")
    speed.set_xticks(xs, names, rotation=20, fontsize=9)
    rates = [(key, [s[key] or None for s in stores]) for key in ("resumes_per_s", "appends_per_s")]
    if wide(rates):
        speed.set_yscale("log")
    speed.set_ylabel("per second")
    speed.set_title(f"Throughput: {title}", fontsize=12)
    speed.legend(fontsize=9)
    _truth_bars(truth, stores)
    return _save(fig, directory / "throughput.png")


#: The wrong outcomes drawn beside speed: (outcome counted in a row, label).
WRONG = (
    ("losses", "lost (a silent gap)"),
    ("duplicates", "duplicated"),
    ("wrong_stream", "another stream's events"),
    ("incorrect_failures", "refused, could resume"),
)


def wrong(store: dict[str, Any]) -> int:
    """How many of a store's reconnects were answered wrong (all but exact or rightly refused)."""
    return sum(store.get(key) or 0 for key, _ in WRONG)


def _label(store: dict[str, Any], sep: str = " ") -> str:
    """A store's name, with how many of its reconnects it answered wrong, if any."""
    bad = wrong(store)
    return (
        f"{store['name']}{sep}({bad:,} of {store.get('reconnects') or 0:,} wrong)"
        if bad
        else store["name"]
    )


def _truth_bars(ax: Any, stores: list[dict[str, Any]]) -> None:
    """Stacked per store: the share of its reconnects answered each wrong way (0 is right)."""
    xs = list(range(len(stores)))
    bottom = [0.0] * len(stores)
    for key, label in WRONG:
        share = [100 * (s.get(key) or 0) / (s.get("reconnects") or 1) for s in stores]
        ax.bar(xs, share, 0.6, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, share, strict=True)]
    for x, s in zip(xs, stores, strict=True):
        ax.annotate(
            f"{wrong(s):,} of {s.get('reconnects') or 0:,}" if wrong(s) else "none wrong",
            (x, bottom[x]),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_xticks(xs, [s["name"] for s in stores], rotation=20, fontsize=9)
    ax.set_ylim(0, max(10.0, *bottom) * 1.15)
    ax.set_ylabel("% of reconnects answered wrong")
    ax.set_title("Correctness: wrong answers (0 is right)", fontsize=12)
    ax.legend(fontsize=9)


def _history_plot(stores: list[dict[str, Any]], title: str, directory: Path) -> Path | None:
    """The latency of one resume against the history the session holds (None: not measured)."""
    import matplotlib.pyplot as plt

    curves = {
        _label(s): sorted((int(k), v["p50_ms"]) for k, v in s["resume_by_history"].items())
        for s in stores
    }
    curves = {name: points for name, points in curves.items() if points}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
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
    ax.set_title(f"Resume cost against history size: {title}", fontsize=12)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    return _save(fig, directory / "cost_by_history.png")


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
    fig, ax = plt.subplots(figsize=FIGSIZE)
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
    names = [_label(s, "\n") + ("\n(in process)" if "redis" not in s else "") for s in stores]
    ax.set_xticks(xs, names, rotation=20, fontsize=9)
    if wide(series):
        ax.set_yscale("log")
    ax.set_ylabel("CPU µs per resume")
    ax.set_title(f"CPU per resume: {title}", fontsize=12)
    ax.legend(fontsize=9)
    return _save(fig, directory / "cpu_per_resume.png")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _loggable(values: list[float]) -> bool:
    finite = [v for v in values if _finite(v)]
    return bool(finite) and min(finite) > 0


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

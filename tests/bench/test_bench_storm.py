"""``replaystore bench storm``: the command, its judge, and its replica processes.

Tiny sizes: these prove the command runs and reports what it must (required
JSON keys, replaystore exact under every pathology, the peers' silent outcomes
counted, the table, the plots), not how fast anything is.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from replaystore.bench import main
from replaystore.bench.stores import Reply
from replaystore.bench.truth import judge
from replaystore.bench.workload import PATHOLOGIES, Reconnect
from replaystore.testing import (
    ServerHandle,
    find_free_port,
    redis_server_binary,
    start_cluster,
    start_standalone,
)
from replaystore.testing.replicas import ReplicaError, ReplicaPool

REQUIRED = (
    "name",
    "resumes_per_s",
    "p50_ms",
    "p99_ms",
    "duplicates",
    "losses",
    "wrong_stream",
    "explicit_failures",
    "incorrect_verdicts",
)
PNG = b"\x89PNG\r\n\x1a\n"


def _check_report(report: dict[str, Any], table: str, plots: Path, floor: str) -> None:
    names = [s["name"] for s in report["stores"]]
    assert names[0] == "replaystore"
    assert floor in names and floor.startswith("raw")
    assert any("fastmcp" in n for n in names)
    for store in report["stores"]:
        for key in REQUIRED:
            assert key in store, (store["name"], key)
        assert store["reconnects"] > 0
        assert store["resumes_per_s"] > 0
        assert f"| {store['name']} |" in table
    rs = report["stores"][0]
    assert rs["duplicates"] == rs["losses"] == rs["wrong_stream"] == 0
    assert rs["incorrect_verdicts"] == 0
    assert rs["exact"] > 0
    assert rs["replica_cpu_us_per_resume"] > 0
    latency = rs["latency_ms_by_kind"]
    assert set(latency) == set(rs["outcomes_by_kind"])
    assert all(0 < k["p50"] <= k["p99"] for k in latency.values())
    by_kind = rs["outcomes_by_kind"]
    for kind in PATHOLOGIES:
        assert kind in by_kind, kind
    for kind in ("conflated", "evicted", "ahead", "foreign"):
        assert set(by_kind[kind]) == {"correct_failure"}, (kind, by_kind[kind])
    assert set(by_kind["normal"]) == {"exact"} and set(by_kind["second"]) == {"exact"}
    assert rs["answers_by_kind"]["conflated"] == {
        "sequence_mismatch": by_kind["conflated"]["correct_failure"]
    }
    # The judge can say no: the floor resumes a cursor of another session, silently.
    raw = next(s for s in report["stores"] if s["name"] == floor)
    assert raw["incorrect_verdicts"] > 0
    assert "| replaystore figure | target | measured | met |" in table
    for name in ("latency_cdf.png", "throughput.png", "cost_by_history.png"):
        assert (plots / name).read_bytes()[:8] == PNG, name
        width, height = _png_size(plots / name)
        assert width >= 1200 and height >= 700, (name, width, height)  # readable
    # Correctness is drawn beside speed: the throughput plot has a second panel.
    assert _png_size(plots / "throughput.png")[0] > _png_size(plots / "latency_cdf.png")[0]
    # What the columns and kinds mean is said under the table.
    for term in ("- floor: ", "- loss: ", "- wrong stream: ", "conflated (the GET stream"):
        assert term in table, term


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[16:24]
    return int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")


def test_storm_on_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "storm.json"
    argv = ["storm", "--sessions", "60", "--json", str(out)]
    assert main([*argv, "--plots", str(tmp_path / "plots")]) == 0
    report = json.loads(out.read_text())
    printed = capsys.readouterr()
    _check_report(report, printed.out, tmp_path / "plots", "raw-memory")
    assert report["meta"]["options"]["replicas"] == 1  # memory lives in one process
    assert "sdk-example" in [s["name"] for s in report["stores"]]
    # stderr is not a terminal here: progress comes as lines, each phase begun and ended
    resumes = report["stores"][0]["resumes"]
    assert "replaystore: storm: 0/" in printed.err
    assert f"replaystore: storm: {resumes}/{resumes} in " in printed.err
    # 48 resumes: the table says the run is too short to judge speed, and judges no ratio
    assert "**Too short to judge speed**: " in printed.out
    assert "| resumes/s vs the raw floor | >= 0.8x |" in printed.out
    ratio = next(t for t in printed.out.splitlines() if t.startswith("| resumes/s vs the raw"))
    assert ratio.endswith("| too short to judge |"), ratio
    # The same figures from a run long enough: judged, and no such line.
    from replaystore.bench.report import MIN_RESUMES, markdown

    for store in report["stores"]:
        store["resumes"] = MIN_RESUMES
    report["meta"]["options"]["rounds"] = 3
    table = markdown(report)
    assert "Too short" not in table and "One round" not in table
    ratio = next(t for t in table.splitlines() if t.startswith("| resumes/s vs the raw"))
    assert ratio.endswith(("| yes |", "| **no** |")), ratio
    # Rounds whose ratios nobody measured say so rather than list nothing.
    report["ratios"]["by_round"] = [{}, {}, {}]
    assert "round by round:\n\n- none measured: " in markdown(report)


@pytest.fixture
def redis_handle(real_servers: dict[str, ServerHandle]) -> ServerHandle:
    if "redis" not in real_servers:
        real_servers["redis"] = start_standalone(redis_server_binary(), "redis")
    return real_servers["redis"]


@pytest.mark.realserver
def test_storm_on_redis_with_replica_processes(tmp_path: Path, redis_handle: ServerHandle) -> None:
    out = tmp_path / "storm.json"
    command = [
        sys.executable, "-m", "replaystore", "bench", "storm",
        "--url", redis_handle.url, "--replicas", "2", "--sessions", "60", "--no-progress",
        "--json", str(out), "--plots", str(tmp_path / "plots"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    _check_report(report, done.stdout, tmp_path / "plots", "raw-streams")
    assert report["meta"]["options"]["replicas"] == 2
    names = [s["name"] for s in report["stores"]] + [u["name"] for u in report["unavailable"]]
    assert "mcp-persist" in names  # run, or said why not
    rs = report["stores"][0]
    for key in ("cpu_us_per_resume", "cpu_us_per_append", "bytes_per_event"):
        assert isinstance(rs["redis"][key], float), key
    assert {t["figure"] for t in report["targets"]} >= {"resumes/s vs the raw floor"}


@pytest.mark.realserver
def test_rounds_pool_every_store_and_keep_each_rounds_ratios(
    tmp_path: Path, redis_handle: ServerHandle
) -> None:
    out = tmp_path / "storm.json"
    command = [
        sys.executable, "-m", "replaystore", "bench", "storm", "--url", redis_handle.url,
        "--replicas", "2", "--sessions", "40", "--no-progress", "--json", str(out),
        "--store", "replaystore", "--store", "raw-streams", "--rounds", "3",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["meta"]["options"]["rounds"] == 3
    for store in report["stores"]:
        rounds = store["rounds"]
        assert len(rounds) == 3
        assert store["resumes"] == store["reconnects"] == sum(r["resumes"] for r in rounds)
        assert store["storm_seconds"] == pytest.approx(
            sum(r["storm_seconds"] for r in rounds), abs=0.002
        )
        # Each round's seconds are rounded to the millisecond, and a round of
        # 40 sessions can take a few: the rate is bounded by what they allow.
        slack = 0.0005 * len(rounds)
        fastest = store["resumes"] / max(store["storm_seconds"] - slack, 1e-6)
        slowest = store["resumes"] / (store["storm_seconds"] + slack)
        assert slowest * 0.999 <= store["resumes_per_s"] <= fastest * 1.001
        # one round's history sweep, not three
        assert store["resume_by_history"] and len(store["resume_by_history"]) < 10
    rs = report["stores"][0]
    assert rs["name"] == "replaystore"
    assert rs["duplicates"] == rs["losses"] == rs["wrong_stream"] == rs["incorrect_verdicts"] == 0
    # every round judged: each pathology three times over
    assert sum(rs["outcomes_by_kind"]["foreign"].values()) % 3 == 0
    by_round = report["ratios"]["by_round"]
    assert len(by_round) == 3
    for n, ratios in enumerate(by_round):
        raw = report["stores"][1]["rounds"][n]
        mine = rs["rounds"][n]
        assert ratios["resumes_per_s_vs_floor"] == pytest.approx(
            mine["resumes_per_s"] / raw["resumes_per_s"], rel=1e-2
        )
        assert ratios["redis_cpu_per_resume_vs_floor"] > 0
    line = next(x for x in done.stdout.splitlines() if x.startswith("- resumes/s: "))
    assert line.count("x") == 3


def _reconnect(kind: str = "normal", held: int = 1) -> Reconnect:
    return Reconnect(0, kind, "s", "1", "c", held, 0)


@pytest.mark.parametrize(
    ("reply", "possible", "expected"),
    [
        (Reply(["c", "d"], False, "resumed"), True, "exact"),
        (Reply(["c"], False, "resumed"), True, "exact"),  # "d" was appended after it began
        (Reply([], False, "resumed"), True, "loss"),
        (Reply(["d"], False, "resumed"), True, "loss"),
        (Reply(["b", "c"], False, "resumed"), True, "duplicate"),
        (Reply(["c", "c"], False, "resumed"), True, "duplicate"),
        (Reply(["c", "x"], False, "resumed"), True, "wrong_stream"),
        (Reply(None, False, "returned_none"), False, "loss"),
        (Reply(["c"], False, "resumed"), False, "loss"),
        (Reply(None, True, "below_floor"), False, "correct_failure"),
        (Reply(None, True, "below_floor"), True, "incorrect_failure"),
    ],
)
def test_judge(reply: Reply, possible: bool, expected: str) -> None:
    truth = ["a", "b", "c", "d"]
    done_at = {"d": 10.0}  # appended during the storm, returned at t=10
    assert judge(_reconnect(), reply, 5.0, truth, done_at, possible=possible) == expected
    if expected == "exact" and reply.events == ["c"]:
        # began after "d" returned: "c" alone now misses it
        assert judge(_reconnect(), reply, 11.0, truth, done_at, possible=True) == "loss"


def test_replica_failure_is_reported_and_the_pool_stops() -> None:
    with (
        ReplicaPool("replaystore.bench.worker:serve", 1) as pool,
        pytest.raises(ReplicaError, match="'fill' before 'open'"),
    ):
        pool.call_all([("fill", None)])
    assert not pool._workers  # stopped and joined


def _keys(handle: ServerHandle) -> set[bytes]:
    client = redis.Redis(port=handle.ports[0])
    try:
        return set(client.scan_iter(count=1000))
    finally:
        client.close()


HTTP_ROWS = [
    "replaystore (round-robin)",
    "replaystore (sticky)",
    "sdk-example (sticky)",
    "fastmcp (sticky)",
    "floor (sticky)",
]


def _http_storm(tmp_path: Path, url: str, *extra: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "http.json"
    command = [
        sys.executable, "-m", "replaystore", "bench", "storm", "--http",
        "--url", url, "--replicas", "2", "--no-progress",
        "--json", str(out), "--plots", str(tmp_path / "plots"), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    rows = report["stores"]
    assert [r["name"] for r in rows] == HTTP_ROWS
    for row in rows:
        assert f"| {row['name']} |" in done.stdout
        assert row["resumes_per_s"] > 0 and row["recovery_s"] > 0
        # Every replica's CPU was read from /proc, and the store layer's share shows.
        assert len(row["replica_cpu_s"]) == 2
        assert row["replica_cpu_us_per_resume"] is not None
        assert ("redis" in row) == (not row["in_process"])
    assert rows[2]["in_process"] and "| in process |" in done.stdout
    # The goals against the SDK's store with sticky routing, computed in this run.
    ratios = report["ratios"]
    assert ratios["baseline"] == "sdk-example (sticky)"
    rr, sdk = rows[0], rows[2]
    assert ratios["recovery_vs_sdk"] == round(rr["recovery_s"] / sdk["recovery_s"], 3)
    assert ratios["replica_cpu_per_resume_vs_sdk"] == round(
        rr["replica_cpu_us_per_resume"] / sdk["replica_cpu_us_per_resume"], 3
    )
    figures = {t["figure"]: t for t in report["targets"]}
    assert figures["replaystore (round-robin): losses"]["met"] == (rr["losses"] == 0)
    assert "| replaystore (round-robin): replica CPU per resume vs" in done.stdout
    return report, done.stdout


def _assert_exact(row: dict[str, Any], sessions: int, bad: int) -> None:
    assert row["reconnects"] == sessions
    seen = (row["name"], row["outcomes_by_kind"], row["answers_by_kind"])
    assert row["duplicates"] == row["losses"] == row["wrong_stream"] == 0, seen
    assert row["incorrect_verdicts"] == 0
    assert row["outcomes_by_kind"]["normal"] == {"exact": sessions - 2 * bad}
    for kind in ("foreign", "ahead"):
        assert row["outcomes_by_kind"][kind] == {"correct_failure": bad}
        assert set(row["answers_by_kind"][kind]) <= {"foreign_cursor", "ahead_of_high_water"}


@pytest.mark.realserver
def test_storm_over_http_every_store_on_the_mcp_wire_with_a_replica_killed(
    tmp_path: Path, redis_handle: ServerHandle
) -> None:
    """One run of every store over HTTP, replica 0 killed half-way through each storm.

    The first half of each storm runs with every replica up, the second with
    one gone: replaystore is exact in both, the stores in process memory lose
    the killed replica's sessions.
    """
    before = _keys(redis_handle)
    report, out = _http_storm(
        tmp_path, redis_handle.url, "--sessions", "24", "--concurrency", "4", "--kill-replica"
    )
    left = _keys(redis_handle) - before
    assert not left, f"the run left its sessions in Redis: {sorted(left)[:5]}"
    # No history sweep over HTTP: the plots that have data, on axes that can show it.
    plots = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert plots == ["cpu_per_resume.png", "latency_cdf.png", "throughput.png"]
    assert "One replica killed" in out
    rows = {r["name"]: r for r in report["stores"]}
    for name in HTTP_ROWS:
        assert rows[name]["killed"]["replica"] == 0
        assert rows[name]["replica_cpu_s"][0] is not None  # read just before the kill
    for name in HTTP_ROWS[:2]:  # any replica serves the killed one's sessions
        _assert_exact(rows[name], 24, 1)
    # The SDK example's store names a call's stream by its request id, in one
    # namespace for every session: each client calls with an id of its own, so a
    # resume replays that call's events and no other client's.
    assert rows["sdk-example (sticky)"]["wrong_stream"] == 0
    assert rows["floor (sticky)"]["duplicates"] == rows["floor (sticky)"]["losses"] == 0
    # In process memory, the killed replica's sessions are gone: not one of
    # them comes back exact afterwards (a 404 at best).
    for name in HTTP_ROWS[2:]:
        row = rows[name]
        assert row["exact"] < row["reconnects"] - 2, row["outcomes_by_kind"]


@pytest.mark.realserver
def test_storm_over_http_in_rounds_against_the_floor(tmp_path: Path) -> None:
    """The floor answers every reconnect right; rows are medians over rounds; ratios in the JSON."""
    out = tmp_path / "rounds.json"
    command = [
        sys.executable, "-m", "replaystore", "bench", "storm", "--http", "--spawn-redis",
        "--sessions", "24", "--replicas", "1", "--concurrency", "4", "--rounds", "2",
        "--store", "replaystore", "--store", "sdk-example", "--store", "floor",
        "--no-progress", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["stores"]}
    assert list(rows) == [*HTTP_ROWS[:3], "floor (sticky)"]
    floor = rows["floor (sticky)"]
    _assert_exact(floor, 2 * 24, 2 * 1)  # two rounds (one bad cursor of each kind), summed
    assert floor["answers_by_kind"]["foreign"] == {"foreign_cursor": 2}
    assert floor["answers_by_kind"]["ahead"] == {"ahead_of_high_water": 2}
    assert "redis" in floor and not floor["in_process"]
    for row in rows.values():
        rounds = row["rounds"]
        assert len(rounds) == 2
        assert row["replica_cpu_us_per_resume"] == pytest.approx(
            statistics.median(r["replica_cpu_us_per_resume"] for r in rounds), abs=1e-3
        )
    # The order rotates: the first store of round 1 is not the first of round 2.
    firsts = [
        next(n for n, r in rows.items() if r["rounds"][k]["order_in_round"] == 0) for k in (0, 1)
    ]
    assert firsts[0] != firsts[1]
    ratios = report["ratios"]
    assert ratios["floor"] == "floor (sticky)"

    def ratio(a: str, b: str) -> float | None:  # a CPU tick is 10 ms: a tiny run may read 0
        mine, theirs = (rows[n]["replica_cpu_us_per_resume"] for n in (a, b))
        return round(mine / theirs, 3) if mine and theirs else None

    assert ratios["replica_cpu_per_resume_vs_floor"] == {
        n: ratio(n, "floor (sticky)") for n in rows
    }
    pairs = {
        "replaystore (sticky) / floor (sticky)",
        "replaystore (round-robin) / floor (sticky)",
        "replaystore (sticky) / sdk-example (sticky)",
    }
    assert ratios["replica_cpu_per_resume"] == {p: ratio(*p.split(" / ")) for p in pairs}
    assert [set(r) for r in ratios["by_round"]] == [pairs, pairs]
    figures = {t["figure"]: t for t in report["targets"]}
    for pair in pairs:
        target = figures[f"replica CPU per resume: {pair}"]
        assert target["value"] == ratios["replica_cpu_per_resume"][pair]
    assert "| floor (sticky) | sticky |" in done.stdout
    assert "medians over the rounds" in done.stdout


@pytest.mark.realserver
def test_storm_on_a_redis_cluster_it_starts(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    command = [
        sys.executable, "-m", "replaystore", "bench", "storm", "--spawn-cluster",
        "--replicas", "2", "--sessions", "60", "--no-progress", "--json", str(out),
        "--plots", str(tmp_path / "plots"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["meta"]["backend"] == "redis cluster"
    assert report["meta"]["redis"]["nodes"] == 3
    assert report["meta"]["options"]["url"].startswith("redis+cluster://")
    names = [s["name"] for s in report["stores"]]
    assert names[:2] == ["replaystore", "raw-streams"]
    skipped = {u["name"] for u in report["unavailable"]}
    assert set(names) | skipped >= {"replaystore", "raw-streams", "fastmcp", "mcp-persist"}
    rs = report["stores"][0]
    assert rs["duplicates"] == rs["losses"] == rs["wrong_stream"] == 0
    assert rs["incorrect_verdicts"] == 0
    for kind in ("conflated", "evicted", "ahead", "foreign"):
        assert set(rs["outcomes_by_kind"][kind]) == {"correct_failure"}, kind
    # Redis CPU summed over the three masters.
    assert rs["redis"]["cpu_us_per_resume"] > 0
    for store in report["stores"]:
        assert f"| {store['name']} |" in done.stdout


@pytest.mark.realserver
def test_storm_on_a_cluster_url_deletes_its_keys(
    tmp_path: Path, real_servers: dict[str, ServerHandle]
) -> None:
    if "cluster" not in real_servers:
        real_servers["cluster"] = start_cluster(redis_server_binary(), masters=3)
    handle = real_servers["cluster"]
    command = [
        sys.executable, "-m", "replaystore", "bench", "storm", "--url", handle.url,
        "--store", "replaystore", "--store", "raw-streams", "--replicas", "2",
        "--sessions", "30", "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for port in handle.ports:
        client = redis.Redis(port=port)
        try:
            left = list(client.scan_iter(match="rsbench:*", count=1000))
        finally:
            client.close()
        assert not left, (port, left[:3])


def test_unreachable_redis_is_one_line_and_exit_2() -> None:
    url = f"redis://127.0.0.1:{find_free_port()}/0"
    command = [sys.executable, "-m", "replaystore", "bench", "storm", "--url", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(f"replaystore bench: cannot reach {url}: ")
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""


def test_the_plan_mixes_each_pathology_at_the_stated_rate_and_routes_by_store() -> None:
    from replaystore.bench.workload import plan_reconnects, plan_sessions

    sessions = plan_sessions(
        500, replicas=3, events=4, pathology_rate=0.1, small_retention=20, seed=7
    )
    truth = {
        (s.session, name): [f"{s.session}/{name}/{k}" for k in range(s.events_per_stream)]
        for s in sessions
        for name in s.streams
    }
    owner = {s.session: s.owner for s in sessions}

    def plan(sticky: bool) -> list[Reconnect]:
        return plan_reconnects(
            sessions, truth, replicas=3, share=0.8, pathology_rate=0.1, sticky=sticky, seed=7
        )

    roaming, sticky = plan(False), plan(True)
    kinds = [r.kind for r in roaming]
    for kind in ("conflated", "evicted", "ahead", "foreign"):
        assert kinds.count(kind) == 10, kind  # 500 * 0.1 / 5
    assert kinds.count("second") == 20  # two connections each
    assert len(roaming) == 400 + 10 + 10  # 80 %, plus the evicted sessions and second connections
    assert all(r.replica != owner[r.session] for r in roaming)
    assert all(r.replica == owner[r.session] for r in sticky)
    # Every store gets the same reconnects (ids differ, picks do not).
    assert [(r.kind, r.session, r.stream, r.held) for r in roaming] == [
        (r.kind, r.session, r.stream, r.held) for r in sticky
    ]
    for r in roaming:
        own = truth[(r.session, r.stream)]
        if r.kind in ("normal", "second", "ahead", "evicted"):
            assert r.cursor == own[r.held]
        else:  # conflated and foreign present a cursor of another stream
            assert r.cursor not in own


@pytest.mark.parametrize(
    "bad",
    [
        ["--sessions", "0"],
        ["--share", "1.5"],
        ["--pathology-rate", "-0.1"],
        ["--concurrency", "0"],
        ["--rounds", "0"],
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["storm", *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"replaystore bench: {bad[0]} must ")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["--kill-replica"], "--kill-replica needs --http"),
        (["--http", "--spawn-cluster"], "--http runs on one Redis"),
        (["--spawn-redis", "--spawn-cluster"], "exclude each other"),
        (["--store", "floor"], "--store floor runs with --http"),
    ],
)
def test_options_that_do_not_go_together_are_one_line_and_exit_2(
    bad: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["storm", *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replaystore bench: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_plots_without_matplotlib_are_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a run of many minutes whose table is lost to an ImportError at the end."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    argv = ["storm", "--sessions", "10", "--no-progress", "--plots", str(tmp_path / "p")]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.err.startswith("replaystore bench: --plots needs matplotlib")
    assert len(out.err.strip().splitlines()) == 1 and out.out == ""
    assert not (tmp_path / "p").exists()


def test_plots_of_latencies_that_round_to_zero(tmp_path: Path) -> None:
    """A log axis takes only positive values: a 0.000 ms latency must not cost the plot."""
    from replaystore.bench.report import write_plots

    store = {
        "name": "fast",
        "latency_cdf_ms": [0.0] * 101,
        "resumes_per_s": 10.0,
        "appends_per_s": None,
        "resume_by_history": {"10": {"p50_ms": 0.0}, "100": {"p50_ms": 0.0}},
    }
    report = {"meta": {"options": {"sessions": 1, "replicas": 1}, "backend": "memory"}}
    paths = write_plots({**report, "stores": [store]}, tmp_path / "zero")
    assert [p.name for p in paths] == ["latency_cdf.png", "throughput.png", "cost_by_history.png"]
    for path in paths:
        assert path.read_bytes()[:8] == PNG
    # A run without a history sweep (--http): no empty plot on log axes.
    store["resume_by_history"] = {}
    paths = write_plots({**report, "stores": [store]}, tmp_path / "http")
    assert [p.name for p in paths] == ["latency_cdf.png", "throughput.png"]


def test_plots_draw_no_redis_bar_for_an_in_process_store(tmp_path: Path) -> None:
    """An in-process store has no Redis: no Redis bar (not a zero), and a labelled tick."""
    from replaystore.bench.report import cpu_series, wide, write_plots

    def row(name: str, redis_us: float | None, cdf: list[float | None]) -> dict[str, Any]:
        r: dict[str, Any] = {
            "name": name,
            "latency_cdf_ms": cdf,
            "resumes_per_s": 10.0,
            "appends_per_s": None,
            "resume_by_history": {},
            "replica_cpu_us_per_resume": 900.0,
        }
        if redis_us is not None:
            r["redis"] = {"cpu_us_per_resume": redis_us}
        return r

    stores = [
        row("on-redis", 40.0, [1.0] * 101),
        row("in-memory", None, [0.5] * 101),
        row("nothing-resumed", 0.0, [None] * 101),  # an empty series: no curve, no crash
    ]
    assert cpu_series(stores) == [
        ("replica processes", [900.0, 900.0, 900.0]),
        ("Redis", [40.0, None, 0.0]),
    ]
    assert cpu_series([row("in-memory", None, [])]) == [("replica processes", [900.0])]
    # Redis at 10 µs beside an in-process peer at 2,000: a log axis, else a linear one
    assert wide([("replica processes", [80.0, 2000.0]), ("Redis", [10.0, None])])
    assert not wide([("replica processes", [80.0, 120.0]), ("Redis", [10.0, None])])
    report = {"meta": {"options": {"sessions": 1, "replicas": 2}, "backend": "redis"}}
    paths = write_plots({**report, "stores": stores}, tmp_path / "p")
    assert [p.name for p in paths] == ["latency_cdf.png", "throughput.png", "cpu_per_resume.png"]
    for path in paths:
        assert path.read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://x", "--url must be memory://, redis://"),
        ("redis://127.0.0.1:1/abc", "database number"),
        ("memory://a/b", "memory://"),
    ],
)
def test_a_url_the_storm_cannot_use_is_one_line_and_exit_2(url: str, message: str) -> None:
    command = [sys.executable, "-m", "replaystore", "bench", "storm", "--url", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("replaystore bench: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""


@pytest.mark.realserver
@pytest.mark.parametrize("http", [False, True], ids=["replicas", "http"])
def test_ctrl_c_ends_the_run_quietly_and_deletes_its_keys(
    redis_handle: ServerHandle, http: bool
) -> None:
    """Ctrl-C reaches every process of the terminal's group: one line, status 130, no keys."""
    before = _keys(redis_handle)
    command = [
        sys.executable, "-m", "replaystore", "bench", "storm", "--url", redis_handle.url,
        "--replicas", "2", "--sessions", "3000", "--no-progress", *(["--http"] if http else []),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while len(_keys(redis_handle) - before) < 200:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run stored nothing"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert err == "replaystore bench: interrupted\n", err[-3000:]
    assert out == ""
    left = _keys(redis_handle) - before
    assert not left, f"{len(left)} keys left, e.g. {sorted(left)[:3]}"

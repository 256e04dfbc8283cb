"""Smoke test of ``benchmarks.run``: quick mode, structure and correctness only.

It starts its own Redis (``replaystore.testing``), runs every benchmark at tiny
sizes and checks the shape of the report. It never asserts on a time or a
speed ratio: those are noise at these sizes and on a shared machine. (The
reconnect storm and its correctness are ``replaystore bench storm``'s, tested
in ``tests/bench/test_bench_storm.py``.)
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from benchmarks.common import QUICK
from benchmarks.run import render, run_all
from benchmarks.targets import TARGETS

pytestmark = pytest.mark.realserver

SPEED_IDS = {
    "append.redis",
    "append.redis.at_cap",
    "append_many16.redis",
    "append.memory",
    "replay10.redis",
    "replay100.redis",
    "fastmcp.append",
    "fastmcp.append.large",
    "fastmcp.replay10",
    "fastmcp.replay100",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("benchmarks") / "quick.json"
    results = run_all(quick=True, json_path=path, echo=False)
    written: dict[str, Any] = json.loads(path.read_text())
    assert written == json.loads(json.dumps(results))
    return written


def test_report_sections(report: dict[str, Any]) -> None:
    assert set(report) == {
        "meta",
        "speed",
        "inner_commands_per_call",
        "fastmcp_setup",
        "memory",
        "targets",
    }
    assert report["meta"]["quick"] is True
    assert report["meta"]["redis_server"]


def test_speed_rows_are_paired_measurements(report: dict[str, Any]) -> None:
    rows = report["speed"]
    assert {row["id"] for row in rows} == SPEED_IDS
    for row in rows:
        for key in ("subject_us", "baseline_us", "ratio", "ratio_min", "ratio_max"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["id"], key)
        assert row["ratio_min"] <= row["ratio_max"]
        assert row["subject"] and row["baseline"]


def test_inner_command_profile(report: dict[str, Any]) -> None:
    profile = report["inner_commands_per_call"]
    append = profile["replaystore append (below cap)"]["calls"]
    assert append["rpush"] == 1  # one event, one RPUSH, inside one script call
    assert append["fcall"] == 1  # the function library, not a script
    assert profile["replaystore append_many(16)"]["calls"]["rpush"] == 1  # the whole burst
    assert profile["FastMCP replay_events_after (100 events)"]["calls"]["get"] >= 100
    for p in profile.values():
        assert p["server_us_per_call"] >= 0 and p["inner_commands"] > 0


def test_memory_breakdown(report: dict[str, Any]) -> None:
    memory = report["memory"]
    assert memory["events"] == QUICK.memory_events
    rs = memory["replaystore"]
    assert set(rs["keys"]) == {"meta hash", "run index", "sequence lists"}
    assert rs["total_bytes"] == sum(k["bytes"] for k in rs["keys"].values())
    assert rs["bytes_per_event"] > 0 and rs["ratio_to_bare_stream"] > 0
    assert memory["bare_stream"]["bytes_per_event"] > 0
    assert memory["fastmcp"]["bytes_per_event"] > 0


def test_every_cost_target_is_reported(report: dict[str, Any]) -> None:
    """Each target has a measured ratio and says whether it was met (never hidden)."""
    rows = report["targets"]["summary"]
    assert {row["id"] for row in rows} == {target for target, _, _ in TARGETS}
    for row in rows:
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0, row
        assert row["met"] is (row["ratio"] <= row["limit"])
    for key, value in report["targets"]["measured"].items():
        if key.endswith(".cpu"):
            assert value["subject_cpu_us"] >= 0 and value["baseline_cpu_us"] > 0, key


def test_render_prints_every_section(report: dict[str, Any]) -> None:
    text = render(report)
    for heading in ("Speed:", "Redis server time", "Memory:", "Cost targets"):
        assert heading in text
    assert "The floor of an atomic append in Lua" in text

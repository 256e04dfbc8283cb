"""Smoke test of ``benchmarks.tasks``: quick mode, replaystore only, structure and correctness.

It starts its own Redis and two example-server replicas, runs the task
benchmark at tiny sizes without the FastMCP + ``fastmcp-tasks`` peer (which
needs a virtual environment of its own) and checks the shape of the report.
It never asserts on a time or a rate: those are noise on a shared machine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks.tasks import goals, render, run_all

pytestmark = pytest.mark.realserver


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path: Path = tmp_path_factory.mktemp("tasks-bench") / "quick.json"
    results = run_all(quick=True, peer_python=None, json_path=path)
    written: dict[str, Any] = json.loads(path.read_text())
    assert written == json.loads(json.dumps(results))
    return written


def test_replaystore_rows_are_measured(report: dict[str, Any]) -> None:
    assert report["meta"]["quick"] is True
    assert report["peer"] is None
    ours = report["replaystore"]
    latency = ours["latency"]
    assert latency["tasks"] == report["meta"]["sizes"]["latency"]
    assert 0 < latency["p50_ms"] <= latency["p99_ms"]
    assert len(ours["gets"]) == 2  # one row per replica
    assert all(math.isfinite(g["per_second"]) and g["per_second"] > 0 for g in ours["gets"])
    assert ours["idle_cpu_us_per_s"] >= 0
    life = ours["http_life"]
    assert life["cpu_us_per_life"] >= 0 and life["commands_per_life"] > 0


def test_each_task_store_operation_is_one_script_call(report: dict[str, Any]) -> None:
    """create, 5 asks, 5 answers, finish, 20 gets: 32 script calls per task life."""
    life = report["replaystore_store_life"]
    assert life["top_commands"]["evalsha"] == 32
    assert life["cpu_us_per_life"] >= 0


def test_a_task_whose_runner_is_killed_ends_failed(report: dict[str, Any]) -> None:
    kill = report["replaystore"]["kill"]
    assert kill["status_before_kill"] == "input_required"
    assert kill["status"] == "failed"


def test_every_goal_gets_a_verdict(report: dict[str, Any]) -> None:
    rows = goals(report)
    assert len(rows) == 3
    assert [verdict for _, _, verdict in rows[:2]] == ["not measurable"] * 2
    assert rows[2][2] in ("met", "missed")
    text = render(report)
    assert "replaystore:" in text and "goals:" in text
    assert "fastmcp-tasks: not measured (not asked for)" in text

"""Smoke test of ``benchmarks.tasks``: quick mode, replaystore only, structure and correctness.

It starts its own Redis, three replicas on it and three ``memory://NAME``
apps in one process, each set behind a round-robin proxy, runs the task
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

from benchmarks.tasks import FINAL_POLLS, MEMORY, OURS, PEER, REPLICAS, goals, render, run_all

pytestmark = pytest.mark.realserver


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path: Path = tmp_path_factory.mktemp("tasks-bench") / "quick.json"
    results = run_all(quick=True, peer_python=None, json_path=path)
    written: dict[str, Any] = json.loads(path.read_text())
    assert written == json.loads(json.dumps(results))
    return written


@pytest.mark.parametrize("name", [OURS, MEMORY])
def test_both_replaystore_deployments_are_measured(report: dict[str, Any], name: str) -> None:
    assert report["meta"]["quick"] is True
    assert report["systems"][PEER] is None
    ours = report["systems"][name]
    assert ours["replicas"] == REPLICAS
    latency = ours["latency"]
    assert latency["tasks"] == report["meta"]["sizes"]["latency"]
    assert 0 < latency["p50_ms"] <= latency["p99_ms"]
    assert math.isfinite(ours["gets"]["per_second_per_replica"])
    assert ours["gets"]["per_second_per_replica"] > 0
    # A full life waits for each of its 5 questions with at least one poll.
    assert ours["full_life"]["gets_per_life"] >= FINAL_POLLS + 6
    assert ours["short_life"]["gets_per_life"] == FINAL_POLLS


def test_redis_cpu_is_measured_on_redis_only(report: dict[str, Any]) -> None:
    on_redis, in_process = report["systems"][OURS], report["systems"][MEMORY]
    assert on_redis["in_process"] is False and in_process["in_process"] is True
    assert on_redis["idle_cpu_us_per_s"] >= 0
    for life in ("full_life", "short_life"):
        assert on_redis[life]["cpu_us_per_life"] >= 0
        assert on_redis[life]["commands_per_life"] > 0
        assert in_process[life]["cpu_us_per_life"] is None
    assert in_process["idle_cpu_us_per_s"] is None
    text = render(report)
    memory_row = next(line for line in text.splitlines() if line.startswith("| Redis CPU per full"))
    assert memory_row.split("|")[3].strip() == "n/a"


def test_each_task_store_operation_is_one_script_call(report: dict[str, Any]) -> None:
    """create, 5 asks, 5 answers, finish, 20 gets: 32 script calls per task life."""
    life = report["replaystore_store_life"]
    assert life["top_commands"]["evalsha"] == 32
    assert life["cpu_us_per_life"] >= 0


def test_a_task_whose_runner_is_killed_ends_failed(report: dict[str, Any]) -> None:
    kill = report["systems"][OURS]["kill"]
    assert kill["status_before_kill"] == "working"
    assert kill["status"] == "failed"
    assert report["systems"][MEMORY]["kill"] is None


def test_every_goal_gets_a_verdict(report: dict[str, Any]) -> None:
    rows = goals(report)
    assert len(rows) == 4
    assert [verdict for _, _, verdict in rows[:3]] == ["not measurable"] * 3
    assert rows[3][2] in ("met", "missed")
    assert report["ratios"] == {OURS: None, MEMORY: None}
    text = render(report)
    assert "replaystore, memory://NAME (in-process)" in text and "goals:" in text
    assert "fastmcp-tasks: not measured (not asked for)" in text

"""Smoke test of ``replaystore bench task-streams``: one replica, two tiny tasks per reader.

It never asserts on a time or a rate (noise on a shared machine): only that
the command runs end to end, that the resuming reader is judged exact against
the store, and that the listener without replay is judged too (what it lost
counted, never more than was stored).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaystore.bench import main
from replaystore.bench.task_streams import _judge
from replaystore.mcp.client import TaskEvent
from replaystore.taskstore import TaskEvent as StoredEvent

pytestmark = pytest.mark.realserver


def test_the_task_stream_storm_judges_both_readers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    argv = ["task-streams", "--spawn-redis", "--replicas", "1", "--tasks", "2",
            "--steps", "6", "--interval-ms", "20", "--per-connection", "2",
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = {row["name"]: row for row in json.loads(out.read_text())["readers"]}
    resuming, live = rows["replaystore"], rows["listen (no replay)"]
    for row in (resuming, rows["replaystore, finished tasks"]):
        assert row["exact_tasks"] == row["tasks"] == 2
        assert row["received"] == row["stored"] == 2 * (6 + 2)  # steps + 2 statuses
        assert row["resumes"] >= 2 and row["redis_cpu_ms_per_resume"] is not None
    assert live["stored"] == 2 * (6 + 2)
    assert live["received"] + live["lost"] == live["stored"]
    paced = rows["raw LRANGE, at the resumes' pace"]
    assert paced["calls"] == rows["replaystore, finished tasks"]["resumes"]
    for name in ("raw LRANGE, back to back", "raw LRANGE, at the resumes' pace"):
        assert rows[name]["redis_cpu_ms_per_resume"] is not None
    printed = capsys.readouterr().out
    assert "| replaystore | 2/2 |" in printed
    assert "Redis CPU per finished-task resume / raw LRANGE at its pace: " in printed


def test_the_judge_counts_losses_duplicates_disorder_and_wrong_events() -> None:
    stored = [StoredEvent(seq, "com.example/countdown", {"step": seq}, 0) for seq in range(4)]

    def got(seq: int, step: int | None = None) -> TaskEvent:
        return TaskEvent("t", seq, "com.example/countdown", {"step": seq if step is None else step})

    exact = _judge(stored, [got(0), got(1), got(2), got(3)])
    assert exact == {"stored": 4, "received": 4, "lost": 0, "duplicates": 0,
                     "out_of_order": 0, "wrong": 0}  # fmt: skip
    bad = _judge(stored, [got(0), got(2), got(2), got(1, step=9)])
    assert bad["lost"] == 1 and bad["duplicates"] == 1 and bad["out_of_order"] == 2
    assert bad["wrong"] == 1

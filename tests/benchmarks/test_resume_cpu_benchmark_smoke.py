"""Smoke test of ``benchmarks.resume_cpu``: a tiny run, the report's shape, no speed asserted.

Every resume of either side is checked to replay its two events inside the
benchmark itself, so a run that measures the wrong thing fails here.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from benchmarks.common import redis_server
from benchmarks.resume_cpu import main, render, run

pytestmark = pytest.mark.realserver


async def _run(url: str) -> dict[str, object]:
    return await run(url, sessions=12, events=3, rounds=2, concurrency=4)


def test_each_figure_is_measured_for_both_sides() -> None:
    with redis_server() as handle:
        results = asyncio.run(_run(handle.url))
    summary = results["summary"]
    assert isinstance(summary, dict)
    assert set(summary) == {"client_us", "redis_us", "commandstats_us", "resumes_per_s"}
    for key in ("client_us", "resumes_per_s"):
        row = summary[key]
        for side in ("replaystore", "raw", "ratio"):
            assert math.isfinite(row[side]) and row[side] > 0, (key, side)
        assert len(row["ratio_per_round"]) == 2
    assert "client CPU" in render(results)


def test_the_command_line_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sessions", "5", "--rounds", "1", "--concurrency", "2", "--events", "3"]) == 0
    assert "Redis CPU" in capsys.readouterr().out

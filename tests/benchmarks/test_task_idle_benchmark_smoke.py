"""Smoke test of ``benchmarks.task_idle``: one replica, tiny phases, the report's shape.

It never asserts on a time or a rate (noise on a shared machine), only that
each phase is measured and that the idle replica's only commands are its
listen read, its scan and its look at the store's run marker (``HMGET``, once
per check interval: a store restored from an older snapshot is seen), and
that a running task's lease renewal shows up.
"""

from __future__ import annotations

import argparse
import asyncio

import pytest

from benchmarks.task_idle import ROOT, render, run

pytestmark = pytest.mark.realserver


def test_each_phase_is_measured() -> None:
    sizes = argparse.Namespace(
        replicas=1, tasks=1, seconds=1.0, settle=0.5, rounds=1, src=[], json=None
    )
    results = asyncio.run(run(sizes, [ROOT]))
    summary = results["results"][str(ROOT)]["summary"]
    assert set(summary) == {"redis_alone", "idle", "running"}
    assert summary["redis_alone"]["commands_per_s_median"] == 0
    idle = summary["idle"]["by_command_last_round"]
    assert set(idle) <= {"xread", "evalsha", "time", "zrangebyscore", "zrange", "hmget"}
    assert summary["running"]["by_command_last_round"].get("evalsha", 0) > 0
    assert "running" in render(results)

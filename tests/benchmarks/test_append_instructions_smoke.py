"""Smoke test of ``benchmarks.append_instructions``: a few calls per phase, the report's shape.

It never asserts on a count or a ratio beyond what any run must show: each
phase is counted on its own, and an append (a function doing more than the
floor's four commands) executes more instructions than the floor, which
executes more than a raw ``XADD``. A phase whose instrumentation were never
switched on would count nothing and fail. It needs valgrind (with
``callgrind_control``) on PATH, as the machines this suite runs on have.
"""

from __future__ import annotations

import pytest

from benchmarks.append_instructions import render, run

pytestmark = pytest.mark.realserver


def test_each_phase_is_counted() -> None:
    results = run(calls=20, warmup=5)
    counts = results["instructions_per_call"]
    assert set(counts) == {"append", "append_in_turn", "floor", "xadd"}
    assert 0 < counts["xadd"] < counts["floor"] < counts["append"]
    assert counts["floor"] < counts["append_in_turn"]
    assert results["append_vs_floor"] == round(counts["append"] / counts["floor"], 3)
    assert "append / floor" in render(results)

"""Smoke test of ``benchmarks.fail_cost``: one tiny round, the report's shape.

It never asserts on a CPU figure or a ratio (noise at these sizes on a
shared machine), only that every kind is measured with the verdicts it
stands for and that a failed kind leaves no list behind once the buffer
closed.
"""

from __future__ import annotations

import pytest

from benchmarks.fail_cost import KINDS, ROOT, render, run

pytestmark = pytest.mark.realserver


def test_every_kind_is_measured() -> None:
    results = run([ROOT], rounds=1, sessions=5)
    (one,) = results["rounds"][str(ROOT)]
    assert set(one["ratios"]) == set(KINDS[1:-1])
    assert one["good"]["verdicts"] == {"resumed": 5} == one["good_end"]["verdicts"]
    expected = {
        "foreign": "foreign_cursor",
        "ahead": "ahead_of_high_water",
        "mismatch": "sequence_mismatch",
        "unknown_sequence": "unknown_sequence",
        "evicted": "below_floor",
    }
    for kind, verdict in expected.items():
        assert one[kind]["verdicts"] == {verdict: 5}, (kind, one[kind])
        assert one[kind]["lists_left"] == 0, (kind, one[kind])
        assert one[kind]["cpu_us"] > 0
    assert one["good"]["lists_left"] == 10  # two lists per live session
    assert "unknown_sequence" in render(results)

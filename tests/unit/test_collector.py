"""The collector setting a replica runs with (see replaystore.mcp.process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from replaystore.mcp import tune_collector

PROBE = """
import gc
from replaystore.mcp import tune_collector
kept = [[] for _ in range(1000)]  # alive at start-up: frozen
default = gc.get_threshold()
tune_collector(12345)
print(gc.get_freeze_count() >= 1000, gc.get_threshold() == (12345, *default[1:]))
"""


def test_start_up_objects_are_frozen_and_young_collections_are_rarer() -> None:
    # In a process of its own: freezing is for good, it must not touch the test runner.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["True", "True"]


def test_a_threshold_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        tune_collector(0)

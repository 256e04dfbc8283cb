"""Smoke test of ``benchmarks.durability``: it runs on its own primary and replica and
reports both rows. Never a time or a ratio: those are noise at these sizes."""

from __future__ import annotations

import asyncio
import math

import pytest
import redis

from benchmarks.common import QUICK
from benchmarks.durability import render, run_durability
from replaystore.testing import redis_server_binary, start_replicated_pair

pytestmark = pytest.mark.realserver


def test_durability_benchmark_quick() -> None:
    with start_replicated_pair(redis_server_binary(), direct=True) as pair:
        rows = asyncio.run(run_durability(pair.primary.url, QUICK))
        replica = redis.Redis(port=pair.replica.ports[0])
        try:
            durable_keys = replica.keys("bench-durable:*")
        finally:
            replica.close()
    assert [row.id for row in rows] == ["append.durable", "append_many16.durable"]
    for row in rows:
        assert row.group == "durability"
        assert all(math.isfinite(v) and v > 0 for v in (row.subject_us, row.baseline_us, row.ratio))
    assert durable_keys, "the benchmark wrote through the primary to the replica"
    table = render(rows)
    assert table.count("\n") == len(rows) + 1

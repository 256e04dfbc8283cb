"""Smoke test of ``benchmarks.sizing``: every item weighed on a Redis of its own, and the rule's
figures hold (an event costs about its message plus a small overhead; keys that must expire do)."""

from __future__ import annotations

import anyio
import pytest

from benchmarks.sizing import EVENT_BYTES, measure, worked_example
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.realserver


def test_every_item_is_weighed_and_the_example_adds_up(real_servers: RealServers) -> None:
    server = real_servers.own("redis")  # measure() flushes its database
    try:
        found = anyio.run(measure, server.url)
    finally:
        server.stop()
    assert all(item["bytes"] > 0 for item in found.values()), found
    event = found[f"event ({EVENT_BYTES}-byte message)"]["bytes"]
    assert EVENT_BYTES < event < 2 * EVENT_BYTES, found
    assert float(found["health check (deep)"]["lives"].removesuffix(" s")) <= 5.0
    example = worked_example(found)
    assert example["total_mib"] == round(sum(example["bytes"].values()) / (1 << 20), 1)

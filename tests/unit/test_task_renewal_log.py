"""A store outage logs a few lines of lease renewal, not one per renewal."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from replaystore.backends.memory.tasks import MemoryTaskStore
from replaystore.errors import StorageError
from replaystore.mcp.tasks.leases import Run, _beat, renewal_log
from replaystore.taskstore import Beat

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Outage(MemoryTaskStore):
    """A store whose renewals fail while ``down``."""

    down = True

    async def beat_many(
        self, task_ids: Sequence[str], runner: str, lease: float
    ) -> list[Beat | None]:
        if self.down:
            raise StorageError("the store is unreachable: Timeout reading from 127.0.0.1:6379")
        return [Beat("working", {}) for _ in task_ids]


async def test_an_outage_logs_its_start_a_count_per_interval_and_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """75 s of failed renewals every 0.25 s (300 of them): four lines, not 300."""
    now = [0.0]
    failures = renewal_log(clock=lambda: now[0])
    store = _Outage()
    runs = [Run("task-a"), Run("task-b")]
    caplog.set_level(logging.WARNING, logger="replaystore.mcp.tasks")
    for _ in range(300):
        await _beat(store, runs, "me", 5.0, failures)
        now[0] += 0.25
    store.down = False
    await _beat(store, runs, "me", 5.0, failures)
    await _beat(store, runs, "me", 5.0, failures)  # a second success says nothing
    lines = [r.getMessage() for r in caplog.records if r.name == "replaystore.mcp.tasks"]
    assert len(lines) == 4, lines
    assert lines[0].startswith(
        "lease renewal of running tasks failed: the store is unreachable: Timeout reading "
        "from 127.0.0.1:6379 (2 task(s) running here)"
    ), lines[0]
    assert lines[1].startswith(
        "lease renewal of running tasks still failing: 120 failure(s) in the last 30 s"
    )
    assert lines[2].startswith(
        "lease renewal of running tasks still failing: 120 failure(s) in the last 30 s"
    )
    assert lines[3] == "lease renewal of running tasks works again after 75.0 s and 300 failure(s)"
    caplog.clear()
    now[0] += 30  # (a failure right after the end waits a period: a flapping store)
    store.down = True  # a new outage is reported from its start again
    await _beat(store, runs, "me", 5.0, failures)
    assert [r.getMessage()[:37] for r in caplog.records] == [
        "lease renewal of running tasks failed"
    ]

"""A Redis outage in a replica's log: a line when it begins, one when the store is back (and
what came back), however often the replica's loops (notifications, listen events) retried."""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from replaystore import ReplayBuffer
from replaystore.backends.coordination import coordination_of
from replaystore.testing.servers import ServerHandle
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def restartable(real_servers: RealServers) -> ServerHandle:
    return real_servers.own("redis")


@asynccontextmanager
async def _replica_loops(url: str) -> AsyncIterator[None]:
    """What every replica keeps reading: the notifications bus and the listen events."""
    buffer = ReplayBuffer.from_url(url, prefix=f"out{uuid.uuid4().hex[:6]}:")
    coordination = coordination_of(buffer.backend)
    bus = coordination.bus("r1", lambda message: None)
    events = coordination.listen_events(keep=100, block=0.2)
    async with buffer, anyio.create_task_group() as group:
        await group.start(bus.run)
        async with events.reading(lambda text: None):
            yield
        group.cancel_scope.cancel()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("replaystore")]


async def _until_back(caplog: pytest.LogCaptureFixture) -> list[str]:
    with anyio.fail_after(20):  # a hang guard
        while True:
            if any("works again" in line for line in _lines(caplog)):
                break
            await anyio.sleep(0.1)
    await anyio.sleep(1.0)  # anything the loops would still say
    return _lines(caplog)


async def test_a_four_second_outage_is_two_lines_and_an_empty_store_is_named(
    restartable: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="replaystore")
    async with _replica_loops(restartable.url):
        (pid,) = restartable.pids()
        os.kill(pid, signal.SIGKILL)
        down = time.monotonic()
        await anyio.sleep(4.0)  # each loop retries about twice a second meanwhile
        await anyio.to_thread.run_sync(restartable.restart)  # empty: its data is gone
        lines = await _until_back(caplog)
        assert time.monotonic() - down > 4.0
    assert len(lines) == 2, lines
    assert lines[0].startswith("the replay store failed: "), lines
    assert "(logged again every 30 s while it fails)" in lines[0]
    assert lines[1].startswith("the replay store works again after "), lines
    assert "it came back EMPTY" in lines[1], lines


async def test_a_store_back_with_its_data_says_so(
    restartable: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="replaystore")
    async with _replica_loops(restartable.url):
        await anyio.to_thread.run_sync(lambda: restartable.restart(keep_data=True))
        lines = await _until_back(caplog)
    assert len(lines) == 2, lines
    assert lines[1].endswith("; its data is still there"), lines

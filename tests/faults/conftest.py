"""Fixtures for the fault tests: real servers on loopback, shared where a fault leaves them intact.

Faults that only cut connections (through a ``TcpProxy``) run against the
session's shared standalone Redis and cluster; faults that damage a server
(restart, stop, failover, resharding) get servers of their own, started once
per module so the whole directory stays quick.
"""

from __future__ import annotations

import uuid

import pytest

from replaystore import Cursor
from replaystore.testing.servers import ServerHandle
from tests.conftest import _server


def at(event_id: str) -> tuple[str, int]:
    """(epoch, position) of an event id, whatever else the id carries."""
    cursor = Cursor.parse(event_id)
    return cursor.epoch, cursor.position


def positions(event_ids: list[str]) -> list[int]:
    return [at(eid)[1] for eid in event_ids]


def shared_redis(real_servers: dict[str, ServerHandle]) -> ServerHandle:
    """The session's standalone Redis (isolate with a key prefix, change nothing server-wide)."""
    return _server(real_servers, "redis")


@pytest.fixture
def anyio_backend() -> str:
    # redis.asyncio is asyncio-only; this also overrides the root conftest's
    # parametrized fixture.
    return "asyncio"


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"f{uuid.uuid4().hex[:10]}:"

"""Fixtures for the fault tests: real servers on loopback, shared where a fault leaves them intact.

Faults that only cut connections (through a ``TcpProxy``) run against the
session's shared standalone Redis and cluster; faults that damage a server
(restart, stop, failover, resharding) get servers of their own, started once
per module so the whole directory stays quick.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from replaystore import Cursor
from replaystore.testing import TcpProxy
from replaystore.testing.servers import ServerHandle


def at(event_id: str) -> tuple[str, int]:
    """(epoch, position) of an event id, whatever else the id carries."""
    cursor = Cursor.parse(event_id)
    return cursor.epoch, cursor.position


def positions(event_ids: list[str]) -> list[int]:
    return [at(eid)[1] for eid in event_ids]


@contextmanager
def behind_proxies(cluster: ServerHandle) -> Iterator[tuple[str, dict[str, Any], list[TcpProxy]]]:
    """(url, from_url options, proxies): a cluster client built from these reaches every node,
    and discovers the cluster, only through one proxy per node (``address_remap``)."""
    with ExitStack() as stack:
        by_port = {
            port: stack.enter_context(TcpProxy([("127.0.0.1", port)])) for port in cluster.ports
        }

        def remap(address: tuple[str, int]) -> tuple[str, int]:
            proxy = by_port.get(address[1])
            return proxy.address if proxy is not None else address

        url = "redis+cluster://" + ",".join(f"{p.host}:{p.port}" for p in by_port.values())
        yield url, {"address_remap": remap}, list(by_port.values())


@pytest.fixture
def anyio_backend() -> str:
    # redis.asyncio is asyncio-only.
    return "asyncio"


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"f{uuid.uuid4().hex[:10]}:"

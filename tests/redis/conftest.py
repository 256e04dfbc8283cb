"""Fixtures for the Redis-specific tests: real servers only, never the machine's 6379.

Servers that are only read and written under a unique key prefix are shared
with the conformance suite through the session-scoped ``real_servers`` dict
(same keys: ``"redis"``, ``"valkey"``, ``"cluster"``). Tests that change
server-wide state (``CONFIG SET``, ``CONFIG RESETSTAT``, ``SCRIPT FLUSH``,
ACL users, restarts) get a server of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from replaystore.testing.servers import (
    ServerHandle,
    redis_server_binary,
    start_standalone,
    valkey_server_binary,
)
from tests.conftest import _server


@pytest.fixture
def anyio_backend() -> str:
    # redis.asyncio is asyncio-only; this also overrides the root conftest's
    # fixture, which is parametrized over every conformance case.
    return "asyncio"


# The session-wide servers are the conformance suite's (one of each kind per run).
_shared = _server


@pytest.fixture
def redis_server(real_servers: dict[str, ServerHandle]) -> ServerHandle:
    """A standalone Redis shared by the whole test session (isolate with a prefix)."""
    return _shared(real_servers, "redis")


@pytest.fixture
def valkey_server(real_servers: dict[str, ServerHandle]) -> ServerHandle:
    return _shared(real_servers, "valkey")


@pytest.fixture
def cluster_server(real_servers: dict[str, ServerHandle]) -> ServerHandle:
    """A 3-master Redis Cluster shared by the whole test session."""
    return _shared(real_servers, "cluster")


@pytest.fixture(scope="module")
def scratch_server() -> Iterator[ServerHandle]:
    """A standalone Redis of this test module alone: free to RESETSTAT, FLUSH, add ACL users."""
    handle = start_standalone(redis_server_binary(), "redis")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def scratch_valkey() -> Iterator[ServerHandle]:
    """A standalone Valkey of this test module alone."""
    handle = start_standalone(valkey_server_binary(), "valkey")
    yield handle
    handle.stop()


@pytest.fixture
def own_server() -> Iterator[ServerHandle]:
    """A standalone Redis for one test (restarts, maxmemory)."""
    handle = start_standalone(redis_server_binary(), "redis")
    yield handle
    handle.stop()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"rt{uuid.uuid4().hex[:10]}:"

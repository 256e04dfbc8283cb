"""Real servers for the test session, and the ``realserver`` marker taken from their use.

Registered by the root ``conftest.py`` (``pytest_plugins``). Every real server
a test needs comes from ``real_servers``, directly or through one of the
fixtures below, so a test is marked ``realserver`` exactly when its fixtures
(followed through the fixtures they use) include ``real_servers``; a case of
a parametrized fixture that needs one says so with the mark on its parameter.
Marked tests run after the others, so in a run on one process the fast
ones report first (on xdist workers, whole modules are dealt out instead).

Servers that are only read and written under a unique key prefix are shared
by the whole session (one of each kind: ``"redis"``, ``"valkey"``,
``"cluster"``). Tests that change server-wide state (``CONFIG SET``,
``CONFIG RESETSTAT``, ``SCRIPT FLUSH``, ACL users, restarts) get a server of
their own. A missing binary fails loudly (``ServerUnavailable``): CI must run
all of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replaystore.testing.servers import (
    ServerHandle,
    redis_server_binary,
    start_cluster,
    start_standalone,
    valkey_server_binary,
)

#: The fixture every real server comes from.
REAL_SERVERS = "real_servers"


class RealServers(dict[str, ServerHandle]):
    """The session's shared servers by kind, started on free loopback ports on first use."""

    def __init__(self) -> None:
        super().__init__()
        self._own: list[ServerHandle] = []

    def shared(self, kind: str) -> ServerHandle:
        """The session's server of ``kind`` (``redis``, ``valkey``, ``cluster``)."""
        if kind not in self:
            if kind == "redis":
                self[kind] = start_standalone(redis_server_binary(), "redis")
            elif kind == "valkey":
                self[kind] = start_standalone(valkey_server_binary(), "valkey")
            elif kind == "cluster":
                self[kind] = start_cluster(redis_server_binary(), masters=3)
            else:
                raise ValueError(f"no shared server of kind {kind!r}")
        return self[kind]

    def own(self, kind: str = "redis") -> ServerHandle:
        """A standalone server for the caller alone; stopped by it, or at the session's end."""
        binary = redis_server_binary() if kind == "redis" else valkey_server_binary()
        handle = start_standalone(binary, kind)
        self._own.append(handle)
        return handle

    def stop(self) -> None:
        for handle in [*self.values(), *self._own]:
            handle.stop()


@pytest.fixture(scope="session")
def real_servers() -> Iterator[RealServers]:
    servers = RealServers()
    yield servers
    servers.stop()


@pytest.fixture
def redis_server(real_servers: RealServers) -> ServerHandle:
    """A standalone Redis shared by the whole test session (isolate with a prefix)."""
    return real_servers.shared("redis")


@pytest.fixture
def valkey_server(real_servers: RealServers) -> ServerHandle:
    return real_servers.shared("valkey")


@pytest.fixture
def cluster_server(real_servers: RealServers) -> ServerHandle:
    """A 3-master Redis Cluster shared by the whole test session."""
    return real_servers.shared("cluster")


@pytest.fixture(scope="module")
def scratch_server(real_servers: RealServers) -> Iterator[ServerHandle]:
    """A standalone Redis of this test module alone: free to RESETSTAT, FLUSH, add ACL users."""
    handle = real_servers.own("redis")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def scratch_valkey(real_servers: RealServers) -> Iterator[ServerHandle]:
    """A standalone Valkey of this test module alone."""
    handle = real_servers.own("valkey")
    yield handle
    handle.stop()


@pytest.fixture
def own_server(real_servers: RealServers) -> Iterator[ServerHandle]:
    """A standalone Redis for one test (restarts, maxmemory)."""
    handle = real_servers.own("redis")
    yield handle
    handle.stop()


def uses_real_server(item: pytest.Item) -> bool:
    """Whether ``item`` reaches ``real_servers`` through its fixtures, or carries the mark."""
    return REAL_SERVERS in getattr(item, "fixturenames", ()) or (
        item.get_closest_marker("realserver") is not None
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark real-server tests and run them after the fast ones (a stable reordering)."""
    for item in items:
        if uses_real_server(item) and item.get_closest_marker("realserver") is None:
            item.add_marker(pytest.mark.realserver)
    items.sort(key=lambda item: item.get_closest_marker("realserver") is not None)

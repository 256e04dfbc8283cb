"""Backend cases for the conformance suite.

Every test that takes the ``case`` and ``make_buffer`` fixtures runs once per
backend case: the embedded memory backend under asyncio and under trio, and
fakeredis, a real Redis, a real Valkey and a real
Redis Cluster, each started by the test session on loopback ports.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest

from replaystore import ReplayBuffer
from replaystore.testing.servers import (
    ServerHandle,
    redis_server_binary,
    start_cluster,
    start_standalone,
    valkey_server_binary,
)


@dataclass
class BackendCase:
    """How to build buffers for one backend, and how to damage its storage.

    ``damage(buffer, session, position)`` deletes one stored event behind the
    backend's back, the way a bug, an operator or a partial data loss would:
    the only way to reach the ``not_retained`` verdict on purpose.
    """

    name: str
    url: str
    anyio_backend: str
    damage: Callable[[ReplayBuffer, str, int], Awaitable[None]]
    options: Callable[[str], dict[str, Any]] = field(default=lambda prefix: {})


from tests.conformance._damage import damage_memory as _damage_memory  # noqa: E402
from tests.conformance._damage import damage_redis as _damage_redis  # noqa: E402


def _fakeredis_options(prefix: str) -> dict[str, Any]:
    # One FakeServer per test, shared by that test's buffers (its "replicas").
    server = _FAKE_SERVERS.setdefault(prefix, fakeredis.FakeServer())
    return {"prefix": prefix, "client": fakeredis.FakeAsyncRedis(server=server)}


_FAKE_SERVERS: dict[str, fakeredis.FakeServer] = {}

CASE_NAMES = ["memory-asyncio", "memory-trio", "fakeredis", "redis", "valkey", "cluster"]


_REAL = ("redis", "valkey", "cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark real-server tests and run them after the fast ones (a stable reordering)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        case_name = callspec.params.get("case") if callspec else None
        path = str(item.path)
        if case_name in _REAL or "/tests/redis/" in path or "/tests/mcp/" in path:
            item.add_marker(pytest.mark.realserver)
    items.sort(key=lambda item: item.get_closest_marker("realserver") is not None)


@pytest.fixture(scope="session")
def real_servers() -> Iterator[dict[str, ServerHandle]]:
    """Real servers started once per test session, on free loopback ports, only when needed.

    A missing binary fails loudly (``ServerUnavailable``): CI must run all of them.
    """
    started: dict[str, ServerHandle] = {}
    yield started
    for handle in started.values():
        handle.stop()


def _server(real_servers: dict[str, ServerHandle], kind: str) -> ServerHandle:
    if kind not in real_servers:
        if kind == "redis":
            real_servers[kind] = start_standalone(redis_server_binary(), "redis")
        elif kind == "valkey":
            real_servers[kind] = start_standalone(valkey_server_binary(), "valkey")
        else:
            real_servers[kind] = start_cluster(redis_server_binary(), masters=3)
    return real_servers[kind]


@pytest.fixture(params=CASE_NAMES)
def case(request: pytest.FixtureRequest, real_servers: dict[str, ServerHandle]) -> BackendCase:
    name = request.param
    if name.startswith("memory"):
        return BackendCase(
            name, "memory://", name.split("-")[1], _damage_memory, lambda p: {"name": p}
        )
    if name == "fakeredis":
        return BackendCase(name, "redis://", "asyncio", _damage_redis, _fakeredis_options)
    handle = _server(real_servers, name)
    return BackendCase(
        name, handle.url, "asyncio", _damage_redis, lambda prefix: {"prefix": prefix}
    )


@pytest.fixture
def anyio_backend(case: BackendCase) -> str:
    return case.anyio_backend


MakeBuffer = Callable[..., Awaitable[ReplayBuffer]]


@pytest.fixture
async def make_buffer(case: BackendCase) -> AsyncIterator[MakeBuffer]:
    """``await make_buffer(max_events=..., ...)``: a connected buffer on this case's backend.

    Buffers made in one test share one key prefix, so two of them act as two
    replicas of one server; different tests never see each other's keys.
    """
    prefix = f"t{uuid.uuid4().hex[:10]}:"
    made: list[ReplayBuffer] = []

    async def factory(**kwargs: Any) -> ReplayBuffer:
        buffer = ReplayBuffer.from_url(case.url, **case.options(prefix), **kwargs)
        await buffer.__aenter__()
        made.append(buffer)
        return buffer

    yield factory
    for buffer in made:
        await buffer.aclose()
    _FAKE_SERVERS.pop(prefix, None)

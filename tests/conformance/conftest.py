"""Backend cases for the conformance suite.

Every test that takes the ``case`` and ``make_buffer`` fixtures runs once per
backend case: the embedded memory backend under asyncio and under trio,
fakeredis, a real Redis, a real Valkey and a real Redis Cluster (each started
by the test session on loopback ports), and the real Redis again with every
command sent through redis-py's public API, as the backend does when redis-py
lacks a name its direct wire relies on (``replaystore.backends.redis.wire``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest

from replaystore import ReplayBuffer
from replaystore.testing.damage import lose_event


@dataclass
class BackendCase:
    """How to build buffers for one backend, and how to damage its storage.

    ``damage(buffer, session, position)`` deletes one stored event behind the
    backend's back (:func:`replaystore.testing.damage.lose_event`): the only
    way to reach the ``not_retained`` verdict on purpose.
    """

    name: str
    url: str
    anyio_backend: str
    damage: Callable[[ReplayBuffer, str, int], Awaitable[None]] = lose_event
    options: Callable[[str], dict[str, Any]] = field(default=lambda prefix: {})


def _fakeredis_options(prefix: str) -> dict[str, Any]:
    # One FakeServer per test, shared by that test's buffers (its "replicas").
    server = _FAKE_SERVERS.setdefault(prefix, fakeredis.FakeServer())
    return {"prefix": prefix, "client": fakeredis.FakeAsyncRedis(server=server)}


_FAKE_SERVERS: dict[str, fakeredis.FakeServer] = {}

CASE_NAMES = [
    "memory-asyncio",
    "memory-trio",
    "fakeredis",
    "redis",
    "valkey",
    "cluster",
    "redis-public",
]

#: The cases that need a real server process.
_REAL = ("redis", "valkey", "cluster", "redis-public")


@pytest.fixture(
    params=[
        pytest.param(name, marks=pytest.mark.realserver) if name in _REAL else name
        for name in CASE_NAMES
    ]
)
def case(request: pytest.FixtureRequest) -> BackendCase:
    name = request.param
    if name.startswith("memory"):
        return BackendCase(name, "memory://", name.split("-")[1], options=lambda p: {"name": p})
    if name == "fakeredis":
        return BackendCase(name, "redis://", "asyncio", options=_fakeredis_options)
    if name == "redis-public":
        # What a redis-py without the direct wire's names gets (a warning aside).
        from replaystore.backends.redis import wire

        request.getfixturevalue("monkeypatch").setattr(wire, "BY_HAND", False)
    handle = request.getfixturevalue("real_servers").shared(name.removesuffix("-public"))
    return BackendCase(name, handle.url, "asyncio", options=lambda prefix: {"prefix": prefix})


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

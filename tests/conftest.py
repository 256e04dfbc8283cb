"""Backend cases for the conformance suite.

Every test that takes the ``case`` and ``make_buffer`` fixtures runs once per
backend case: the embedded memory backend under asyncio and under trio, and
(added by the Redis issue) fakeredis, a real Redis, a real Valkey and a real
Redis Cluster, each started by the test session on loopback ports.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from replaystore import ReplayBuffer


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


async def _damage_memory(buffer: ReplayBuffer, session: str, position: int) -> None:
    state = buffer.backend._sessions[session]  # type: ignore[attr-defined]
    del state.records[position]


CASES: dict[str, BackendCase] = {
    "memory-asyncio": BackendCase("memory-asyncio", "memory://", "asyncio", _damage_memory),
    "memory-trio": BackendCase("memory-trio", "memory://", "trio", _damage_memory),
}


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest) -> BackendCase:
    return CASES[request.param]


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

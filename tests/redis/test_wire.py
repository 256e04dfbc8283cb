"""The redis-py names the direct wire relies on are checked, and without them the public path works.

The conformance suite runs once more on a real Redis with the direct wire
off (its ``redis-public`` case); here: the check itself, which clients are
sent by hand, and that turning the wire off really changes the path taken.
"""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from replaystore import ReplayBuffer, Verdict
from replaystore.backends.redis import wire
from replaystore.backends.redis.wire import Requirement
from replaystore.testing.servers import ServerHandle

pytestmark = pytest.mark.anyio


def test_the_installed_redis_py_has_every_name() -> None:
    assert wire.missing() == []
    assert wire.BY_HAND is True


@pytest.mark.parametrize(
    "requirement",
    [
        Requirement("Connection()", "_no_such_writer", "attribute", "a renamed attribute"),
        Requirement("AbstractConnection.read_response", "no_such", "parameter", "a parameter"),
        Requirement("ConnectionPool", "no_such_method", "method", "a method"),
        Requirement("Gone", "anything", "attribute", "an owner that cannot be built"),
    ],
)
def test_a_missing_name_is_found_and_warned_once(requirement: Requirement) -> None:
    owners = {"Gone": lambda: (_ for _ in ()).throw(AttributeError("gone"))}
    assert wire.missing([requirement], owners) == [requirement]
    with pytest.warns(RuntimeWarning, match=f"{requirement.name}.*{requirement.why}") as seen:
        assert wire.settle([requirement, *wire.REQUIREMENTS], owners) is False
    assert len(seen) == 1
    assert "public API" in str(seen[0].message)


def test_every_listed_name_is_used_by_the_wire() -> None:
    """The list names what the code touches, no more: each name appears in the wire's source."""
    with open(wire.__file__) as file:
        code = file.read().split("BY_HAND = settle()", 1)[1]
    for r in wire.REQUIREMENTS:
        assert r.name in code, r


def _by_hand(buffer: ReplayBuffer) -> bool:
    backend: Any = buffer.backend
    return bool(backend._wire.by_hand)


async def test_only_plain_clients_of_redis_pys_own_connections_go_by_hand(
    redis_server: ServerHandle, cluster_server: ServerHandle
) -> None:
    async with ReplayBuffer.from_url(redis_server.url, prefix="w:") as plain:
        assert _by_hand(plain)
    async with ReplayBuffer.from_url(cluster_server.url, prefix="w:") as cluster:
        assert not _by_hand(cluster)
    fake = fakeredis.FakeAsyncRedis()
    async with ReplayBuffer.from_url("redis://", client=fake, prefix="w:") as faked:
        assert not _by_hand(faked)


@pytest.mark.parametrize("direct", [True, False])
async def test_without_the_names_every_command_goes_through_redis_py(
    redis_server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    """Same answers either way; only the path differs (and functions are still used)."""
    monkeypatch.setattr(wire, "BY_HAND", direct)
    by_hand: list[str] = []
    for name in ("roundtrip", "pipelined"):
        original = getattr(wire.Wire, name)

        async def counted(self: Any, *args: Any, _name: str = name, _f: Any = original) -> Any:
            by_hand.append(_name)
            return await _f(self, *args)

        monkeypatch.setattr(wire.Wire, name, counted)
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        backend: Any = buf.backend
        assert backend._library.functions
        await buf.open_session("s")
        first = await buf.append("s", "seq", b"a")
        ids = await buf.append_many("s", "seq", [b"b", b"c"])
        replay = await buf.resolve_and_replay("s", first)
        assert replay.verdict is Verdict.RESUMED
        assert [e.event_id for e in replay.events] == ids
        assert backend._library.functions  # FCALL through execute_command works too
    assert bool(by_hand) is direct

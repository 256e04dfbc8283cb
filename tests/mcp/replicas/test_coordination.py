"""What replicas coordinate with, without HTTP: the SDK seam, routing, the registry, the bus."""

from __future__ import annotations

import contextlib
import inspect
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import redis.asyncio
from fakeredis import FakeAsyncRedis
from mcp.server.lowlevel.server import Server

from replaystore import ReplayBuffer
from replaystore.backends.coordination import EventLog, coordination_of
from replaystore.backends.memory import InProcess, MemoryBackend
from replaystore.backends.memory.bus import MemoryBus
from replaystore.backends.memory.registry import MemoryRegistry
from replaystore.backends.notifications import (
    Bus,
    End,
    Forward,
    Handler,
    Takeover,
    Wake,
    decode,
    encode,
)
from replaystore.backends.redis import RedisBackend
from replaystore.backends.redis.coordination import OnRedis
from replaystore.backends.redis.coordination.registry import RedisRegistry
from replaystore.backends.redis.wire import DirectWire
from replaystore.backends.session_registry import FINISHED, Registry, holder_field, holders
from replaystore.mcp._sdk import checked as sdk
from replaystore.mcp._sdk.overrides import ManagerOverrides, ReplicaDispatcher, TransportOverrides
from replaystore.mcp.preflight import check_store
from replaystore.mcp.replicas.forwarding import Route, replica_of, route
from replaystore.mcp.replicas.replica import Replica
from replaystore.mcp.sessions.manager import ReplaySessionManager
from replaystore.mcp.sessions.transport import ReplayTransport
from replaystore.taskstore import TaskStore
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import (
    ServerHandle,
    redis_server_binary,
    start_cluster,
    start_standalone,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ---------------------------------------------------------------- the SDK seam


def test_the_installed_sdk_has_every_private_name() -> None:
    sdk.check()
    sdk.check(fastmcp=True)
    names = {(r.owner, r.name) for r in sdk.requirements()}
    assert ("StreamableHTTPServerTransport", "_handle_get_request") in names
    assert ("JSONRPCDispatcher", "_allocate_id") in names


def test_a_renamed_private_name_fails_at_import_with_the_versions() -> None:
    class RenamedTransport:
        async def _handle_get_request_v2(self) -> None: ...

    gone = sdk.Requirement("Transport", "_handle_get_request", "method", "plain GETs")
    with pytest.raises(sdk.SDKCompatibilityError) as caught:
        sdk.check([gone], owners={"Transport": lambda: RenamedTransport})
    message = str(caught.value)
    assert "Transport._handle_get_request" in message
    assert "mcp 2." in message and sdk.TESTED_MCP in message


def test_an_mcpserver_without_its_lowlevel_server_is_refused() -> None:
    class NotQuiteMCPServer:
        pass

    with pytest.raises(sdk.SDKCompatibilityError, match="_lowlevel_server"):
        sdk.lowlevel_server(NotQuiteMCPServer())


def test_a_missing_parameter_is_reported() -> None:
    def serve(*, other: int) -> None: ...

    gone = sdk.Requirement("serve", "lifespan_state", "parameter", "drives a loop")
    with pytest.raises(sdk.SDKCompatibilityError, match=r"serve\.lifespan_state"):
        sdk.check([gone], owners={"serve": lambda: serve})


def test_every_private_sdk_method_overridden_is_in_one_module_and_listed() -> None:
    """Overrides of private SDK methods live in _sdk/overrides.py only, each with a digest."""

    def private_methods(cls: type) -> set[str]:
        return {
            name
            for name, value in vars(cls).items()
            if name.startswith("_") and not name.startswith("__") and inspect.isfunction(value)
        }

    found = set()
    for cls in (TransportOverrides, ManagerOverrides, ReplicaDispatcher):
        for name in private_methods(cls):
            base = next(b for b in cls.__mro__[1:] if name in vars(b))
            found.add((base.__name__, name))
    # FastMCP methods with a digest are wrapped elsewhere (fastmcp/tasks.py), not overridden.
    listed = {
        (r.owner, r.name)
        for r in sdk.requirements()
        if r.source and not r.owner.startswith("FastMCP")
    }
    assert found == listed
    for cls, seam in (
        (ReplayTransport, TransportOverrides),
        (ReplaySessionManager, ManagerOverrides),
    ):
        sdk_names = {name for base in seam.__mro__[1:] for name in vars(base)}
        assert not private_methods(cls) & sdk_names, cls.__name__


def test_the_upstream_source_of_every_overridden_method_is_the_one_reviewed() -> None:
    """An SDK upgrade that changes an overridden method fails here until the override is re-read.

    Then update ``source=`` of that entry in ``replaystore/mcp/_sdk/checked.py`` to the
    installed digest this message shows.
    """
    assert sdk.changed_sources() == []


def test_a_changed_upstream_method_is_reported_with_both_digests() -> None:
    class Upstream:
        def _handle(self) -> int:
            return 1

    reviewed = sdk.source_digest(Upstream._handle)

    class Upgraded:
        def _handle(self) -> int:
            return 2

    entry = sdk.Requirement("Upstream", "_handle", "method", "x", source=reviewed)
    assert sdk.changed_sources([entry], {"Upstream": lambda: Upstream}) == []
    (changed,) = sdk.changed_sources([entry], {"Upstream": lambda: Upgraded})
    assert changed.startswith("Upstream._handle: reviewed " + reviewed)


# ---------------------------------------------------------------- routing


def test_server_request_ids_name_their_replica() -> None:
    dispatcher = ReplicaDispatcher(None, None)  # type: ignore[arg-type]
    dispatcher.replica = "abc123"
    ids = [dispatcher._allocate_id() for _ in range(3)]
    assert ids == ["1@abc123", "2@abc123", "3@abc123"]
    assert [replica_of(i) for i in ids] == ["abc123"] * 3
    for foreign in (7, "7", "x@y@", "@abc", "a@b", True, None):
        assert replica_of(foreign) is None


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"jsonrpc": "2.0", "id": "4@r1", "result": {}}, Route(replica="r1")),
        ({"jsonrpc": "2.0", "id": "4@r1", "error": {"code": 1, "message": "x"}}, Route("r1")),
        ({"jsonrpc": "2.0", "id": 4, "result": {}}, None),
        (
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": "2@r9", "progress": 1},
            },
            Route(replica="r9"),
        ),
        (
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 12}},
            Route(cancels="12"),
        ),
        (
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": True}},
            None,
        ),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}, None),
        ({"jsonrpc": "2.0", "method": "notifications/progress", "params": "nope"}, None),
    ],
)
def test_route_of_client_messages(message: dict[str, Any], expected: Route | None) -> None:
    assert route(message) == expected


# ---------------------------------------------------------------- registry


class _Store:
    """Stands for a memory store: buffers sharing one share its registry."""


@contextlib.asynccontextmanager
async def _registry(name: str, request: pytest.FixtureRequest) -> AsyncIterator[Registry]:
    if name == "memory":
        yield MemoryRegistry(_Store())
        return
    retention = ReplayBuffer.from_url("memory://").retention
    if name == "redis":  # the wire sends by hand: Redis's own replies, read as they come
        url = request.getfixturevalue("mcp_redis").url
        client: Any = redis.asyncio.Redis.from_url(url)
        prefix = f"reg{uuid.uuid4().hex[:6]}:"
        backend = RedisBackend(retention, client, prefix=prefix)
    else:  # through redis-py's public API: its parsed replies
        backend = RedisBackend(retention, FakeAsyncRedis(), prefix="t:")
    coordination = backend.coordination()
    assert isinstance(coordination, OnRedis)
    assert isinstance(coordination.wire, DirectWire) is (name == "redis")
    registry = coordination.registry()
    assert isinstance(registry, RedisRegistry)
    try:
        yield registry
    finally:
        await backend.aclose()
        await backend.client.aclose()  # a client passed in stays the caller's


@pytest.mark.parametrize("name", ["memory", "fakeredis", "redis"])
async def test_registry_records_and_leases(name: str, request: pytest.FixtureRequest) -> None:
    async with _registry(name, request) as registry:
        await _records_and_leases(registry)


async def _records_and_leases(registry: Registry) -> None:
    assert await registry.get_session("s") is None
    await registry.update_session("s", {"get": "x"})  # never creates a record
    assert await registry.get_session("s") is None
    await registry.put_session("s", {"version": "2025-11-25", "get": "e-1"}, 60)
    await registry.update_session("s", {"get": "e-2"})
    assert await registry.get_session("s") == {"version": "2025-11-25", "get": "e-2"}
    await registry.drop_session("s")
    assert await registry.get_session("s") is None

    # The replicas serving a session, named in its record and read back as it ends.
    assert await registry.hold("s", "r2") is None  # never creates a record
    assert await registry.get_session("s") is None
    assert await registry.end_session("s") is None  # no record: nobody can be named
    await registry.put_session("s", {"version": "v", holder_field("r1"): "1"}, 60)
    named = {"version": "v", holder_field("r1"): "1", holder_field("r2"): "1"}
    assert await registry.hold("s", "r2") == named  # named and read in one step
    assert await registry.get_session("s") == named
    assert holders(named) == {"r1", "r2"}
    assert await registry.end_session("s") == {"r1", "r2"}
    assert await registry.get_session("s") is None
    assert await registry.hold("s", "r3") is None  # too late: it ended
    await registry.put_session("s", {"version": "v"}, 60)  # a record naming nobody
    assert await registry.end_session("s") is None  # every replica is told

    await registry.acquire("s", "7", "r1", 60)
    assert await registry.owner("s", "7") == "r1"
    assert await registry.renew([("s", "7"), ("s", "8")], "r1", 60) == [True, False]
    assert await registry.renew([("s", "7")], "r2", 60) == [False]  # only the holder renews
    await registry.release("s", "7", "r2")
    assert await registry.owner("s", "7") == "r1"
    await registry.release("s", "7", "r1")
    assert await registry.owner("s", "7") == FINISHED
    await registry.acquire("s", "9", "r1", 60)
    await registry.abandon("s", "9", "r2")  # only the holder drops it
    assert await registry.owner("s", "9") == "r1"
    await registry.abandon("s", "9", "r1")
    assert await registry.owner("s", "9") is None  # lapsed at once: lost, not finished
    assert await registry.claim_end("s", "8", 60)
    assert not await registry.claim_end("s", "8", 60)  # exactly once


async def test_a_lease_lapses_when_not_renewed() -> None:
    registry = MemoryRegistry(_Store())
    await registry.acquire("s", "1", "r1", 0.05)
    await anyio.sleep(0.1)
    assert await registry.owner("s", "1") is None


# ---------------------------------------------------------------- replicas in one process


class _Heard:
    """What a replica hands to its process (its Sessions and one session's Followers), in order."""

    def __init__(self, on_hear: Callable[[str, str], None] | None = None) -> None:
        self.heard: list[tuple[str, str]] = []
        self._on_hear = on_hear

    def _add(self, what: str, detail: str) -> None:
        self.heard.append((what, detail))
        if self._on_hear is not None:
            self._on_hear(what, detail)

    def ended_elsewhere(self, session: str) -> None:
        self._add("end", session)

    def forwarded(self, session: str, body: str) -> None:
        self._add("fwd", body)

    def taken_over(self, session: str, stream: str) -> None:
        self._add("takeover", stream)

    def wake(self, sequence: str) -> None:
        self._add("wake", sequence)

    def wake_all(self) -> None:
        self._add("*", "")  # every live connection re-reads the store

    async def end_request(self, session: str, stream: str, message: str) -> None:
        self._add("ended", stream)


def _replica(buffer: ReplayBuffer, sessions: _Heard) -> Replica:
    """A replica of the store ``buffer`` writes to, as the session manager builds one."""
    return Replica(coordination_of(buffer.backend), sessions)


async def test_replicas_on_one_memory_store_hear_each_other() -> None:
    """Two managers on memory://NAME: wake-ups, ends and forwarded messages reach the other one."""
    first = ReplayBuffer.from_url("memory://coordination")
    second = ReplayBuffer.from_url("memory://coordination")
    heard = _Heard()
    one, two = _replica(first, _Heard()), _replica(second, heard)
    async with one.run(), two.run():
        assert isinstance(one.bus, MemoryBus)
        await one.registry.put_session("S", {"version": "v"}, None)
        assert await two.registry.get_session("S") == {"version": "v"}  # one registry
        await one.announce_end("S")
        await one.forward(two.id, "S", b'{"jsonrpc":"2.0","id":"1@x","result":{}}')
    assert heard.heard == [("end", "S"), ("fwd", '{"jsonrpc":"2.0","id":"1@x","result":{}}')]


async def test_a_session_end_is_told_to_the_replicas_its_record_names() -> None:
    """Ending a session tells the replicas that serve it, never the others; a record that
    names nobody (written before records named them) is told to every replica."""
    buffers = [ReplayBuffer.from_url("memory://holders") for _ in range(3)]
    heard = [_Heard() for _ in buffers]
    one, two, three = (_replica(b, h) for b, h in zip(buffers, heard, strict=True))
    async with one.run(), two.run(), three.run():
        await one.registry.put_session("S", {"version": "v", holder_field(one.id): "1"}, None)
        assert await three.registry.hold("S", three.id) is not None  # three adopts it
        await two.announce_end("S", await two.registry.end_session("S"))  # two ended it
        assert await two.registry.hold("S", two.id) is None  # ended: nothing to adopt
        await one.registry.put_session("T", {"version": "v"}, None)
        await one.announce_end("T", await one.registry.end_session("T"))
        await anyio.sleep(0.05)  # the memory bus delivers in tasks of its own
    assert heard[0].heard == [("end", "S")]  # named: told
    assert heard[1].heard == [("end", "T")]  # named in neither record: told only of the old one
    assert heard[2].heard == [("end", "S"), ("end", "T")]


class _OwnCoordination:
    """A third party's coordination: a class of its own, whose parts are the memory ones."""

    spans_processes = False

    def __init__(self, scope: object) -> None:
        self._inner = InProcess(scope)
        self.built: list[str] = []

    def registry(self) -> Registry:
        self.built.append("registry")
        return self._inner.registry()

    def bus(self, replica: str, handler: Handler) -> Bus:
        self.built.append("bus")
        return self._inner.bus(replica, handler)

    def task_store(
        self, *, namespace: str = "", wait_replicas: int = 0, wait_timeout: float = 1.0
    ) -> TaskStore:
        return self._inner.task_store(namespace=namespace)

    def listen_events(self, *, keep: int, block: float | None) -> EventLog:
        return self._inner.listen_events(keep=keep, block=block)

    async def request_state_key(self, candidate: str) -> tuple[str, bool]:
        return await self._inner.request_state_key(candidate)

    async def first_use(self, digest: str, ttl: float) -> str | None:
        return await self._inner.first_use(digest, ttl)

    async def keep_answer(self, digest: str, answer: str, ttl: float) -> None:
        await self._inner.keep_answer(digest, answer, ttl)

    async def probe(self, replica: str, *, subscribe: bool = False) -> None:
        self.built.append("probe")

    async def eviction_warning(self) -> str | None:
        return None

    async def purge(self, session: str) -> None:
        pass


async def test_a_backend_provides_a_coordination_of_its_own() -> None:
    """The MCP layer asks the backend's coordination for its parts, whatever class it is."""
    own = _OwnCoordination(_Store())

    class ThirdParty(MemoryBackend):
        def coordination(self) -> _OwnCoordination:  # type: ignore[override]
            return own

    retention = ReplayBuffer.from_url("memory://").retention
    first = ReplayBuffer(ThirdParty(retention))
    second = ReplayBuffer(ThirdParty(retention))
    heard = _Heard()
    one, two = _replica(first, _Heard()), _replica(second, heard)
    async with one.run(), two.run():
        await one.registry.put_session("S", {"version": "v"}, None)
        assert await two.registry.get_session("S") == {"version": "v"}  # one registry
        await one.announce_end("S")
    assert heard.heard == [("end", "S")]
    assert own.built == ["registry", "bus", "registry", "bus"]
    assert await check_store(first, coordination_of(first.backend)) == []
    assert own.built[-1] == "probe"


def test_a_backend_without_coordination_is_refused_by_name() -> None:
    """A backend that declares no coordination gets a clear error, not a per-process registry."""

    class Plain(MemoryBackend):
        coordination = None  # type: ignore[assignment]

    buffer = ReplayBuffer(Plain(ReplayBuffer.from_url("memory://").retention))
    with pytest.raises(TypeError, match=r"Plain backend does not declare replica coordination"):
        ReplaySessionManager(Server("plain"), buffer)


def test_bus_messages_round_trip_and_junk_is_dropped() -> None:
    for message in (Wake("S", "7"), End("S"), Takeover("S", "_GET_stream"), Forward("S", "{}")):
        assert decode(encode(message, "r1")) == (message, "r1")
    # The wire form other replicas of the same store read (and have read before).
    wire = {"t": "wake", "s": "S", "q": "7", "from": "r1"}
    assert json.loads(encode(Wake("S", "7"), "r1")) == wire
    for junk in (b"", b"[]", b"{}", b'{"t":"wake","s":"S"}', b'{"t":"end","s":1}', b"\xff"):
        assert decode(junk) is None


@pytest.mark.parametrize("kind", ["redis", "cluster"])
async def test_replicas_on_real_redis_and_cluster_hear_each_other(
    kind: str, real_servers: dict[str, ServerHandle]
) -> None:
    """Registry, leases and notifications of two replicas on one real Redis or Cluster."""
    if kind not in real_servers:
        real_servers[kind] = (
            start_standalone(redis_server_binary(), "redis")
            if kind == "redis"
            else start_cluster(redis_server_binary(), masters=3)
        )
    url = real_servers[kind].url
    prefix = f"coord{uuid.uuid4().hex[:6]}:"
    async with (
        ReplayBuffer.from_url(url, prefix=prefix) as first,
        ReplayBuffer.from_url(url, prefix=prefix) as second,
    ):
        woke, three = anyio.Event(), anyio.Event()

        def hear(what: str, detail: str) -> None:
            woke.set()
            if len(heard.heard) == 3:
                three.set()

        heard = _Heard(hear)
        one, two = _replica(first, _Heard()), _replica(second, heard)
        async with one.run(), two.run():
            for session in ("S{1}", "T"):  # a brace in the id must not split the slot
                await one.registry.put_session(session, {"version": "v"}, 60)
                assert await two.registry.get_session(session) == {"version": "v"}
                await one.acquire(session, "7")
                assert await two.registry.owner(session, "7") == one.id
                assert not await two.lease_lapsed(session, "7")
            # The end reads the replicas named and counts it in the store's marker (one
            # script on one server; two calls on a cluster, the marker in another slot).
            assert await two.registry.hold("T", two.id) is not None
            counted = first.backend.marker.count  # type: ignore[attr-defined]
            assert await one.registry.end_session("T") == frozenset({two.id})
            assert first.backend.marker.count == counted + 1  # type: ignore[attr-defined]
            assert await two.registry.get_session("T") is None
            assert await one.registry.end_session("T") is None  # ended already: not counted
            assert first.backend.marker.count == counted + 1  # type: ignore[attr-defined]
            await one.registry.put_session("T", {"version": "v"}, 60)
            two.followers["T"] = heard
            await two.bus.watch("T")
            with anyio.fail_after(10):
                one.wake("T", "7")
                await woke.wait()  # the wake-up first, then the rest, in order
                await one.announce_end("U", frozenset({one.id}))  # it held it alone: no one told
                await one.announce_end("S{1}", frozenset({one.id, two.id}))  # to two only
                await one.forward(two.id, "T", b"{}")
                await three.wait()
            await two.bus.unwatch("T")
    assert heard.heard == [("wake", "7"), ("end", "S{1}"), ("fwd", "{}")]


async def test_the_store_check_leaves_only_keys_with_a_short_expiry(
    real_servers: dict[str, ServerHandle],
) -> None:
    """The start-up (deep) check writes a throwaway session and a lease: what it leaves in
    the store expires within seconds, as docs/deployment.md says, not the tombstones' hour."""
    import redis.asyncio

    if "redis" not in real_servers:
        real_servers["redis"] = start_standalone(redis_server_binary(), "redis")
    url = real_servers["redis"].url
    prefix = f"check{uuid.uuid4().hex[:6]}:"
    async with ReplayBuffer.from_url(url, prefix=prefix) as buffer:
        assert await check_store(buffer, coordination_of(buffer.backend)) == []
    client = redis.asyncio.Redis.from_url(url)
    try:
        left = {key: await client.pttl(key) async for key in client.scan_iter(f"{prefix}*")}
    finally:
        await client.aclose()
    assert all(0 < ms <= 5000 for ms in left.values()), left


async def test_notifications_resume_after_the_connection_is_cut(
    real_servers: dict[str, ServerHandle],
) -> None:
    """The subscription connection is cut: the replica re-reads, resubscribes, hears again."""
    if "redis" not in real_servers:
        real_servers["redis"] = start_standalone(redis_server_binary(), "redis")
    handle = real_servers["redis"]
    prefix = f"cut{uuid.uuid4().hex[:6]}:"
    with TcpProxy([("127.0.0.1", handle.ports[0])]) as proxy:
        async with (
            ReplayBuffer.from_url(handle.url, prefix=prefix) as first,
            ReplayBuffer.from_url(proxy.url(), prefix=prefix) as second,
        ):
            again = anyio.Event()

            def hear(what: str, detail: str) -> None:
                if detail == "after":
                    again.set()

            heard = _Heard(hear)
            one, two = _replica(first, _Heard()), _replica(second, heard)
            async with one.run(), two.run():
                two.followers["T"] = heard
                await two.bus.watch("T")
                assert proxy.sever_all() >= 1
                with anyio.fail_after(20):
                    while not again.is_set():
                        one.wake("T", "after")
                        await anyio.sleep(0.2)
    assert ("*", "") in heard.heard and ("wake", "after") in heard.heard

"""Request leases in-process (no HTTP): a lost request ends once, with its own id.

Two session managers on one ``memory://`` store are two replicas: one runs
a request and stops, the other follows its stream; and a replica whose
store failed ends its requests through its session manager once the store
is back. Also the deadline a store call is given up after (``bounded``),
which every lease and request passes.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from mcp.server.lowlevel.server import Server
from mcp_types import JSONRPCError

from replaystore import ReplayBuffer
from replaystore.errors import StorageError
from replaystore.mcp import ReplayEventStore
from replaystore.mcp.refusals import bounded, note_refusal
from replaystore.mcp.sessions.leases import LOST_REQUEST, end_if_lost, stopped_by_store
from replaystore.mcp.sessions.manager import ReplaySessionManager
from replaystore.mcp.sessions.messages import decode_message, request_id_of, sequence_name
from replaystore.mcp.sessions.tail import Tail

pytestmark = pytest.mark.anyio


def test_a_request_id_is_read_back_from_its_stream_name() -> None:
    for request_id in (7, -3, 0, "call-1", "12a"):
        assert request_id_of(sequence_name(str(request_id))) == request_id
    # A digest cannot be reversed: the error then carries a null id (JSON-RPC allows it).
    assert request_id_of(sequence_name("x" * 500)) is None


async def errors_after(buffer: ReplayBuffer, session: str, cursor: str, stream: str) -> list[Any]:
    replay = await buffer.resolve_and_replay(session, cursor, stream)
    assert replay.ok
    found = [decode_message(e.payload) for e in replay.events if e.payload is not None]
    assert all(isinstance(message, JSONRPCError) for message in found)
    return found


async def test_a_request_whose_replica_stopped_is_ended_once_with_its_id() -> None:
    buffer = ReplayBuffer.from_url(f"memory://leases-{uuid.uuid4().hex[:8]}")
    store = ReplayEventStore(buffer)
    runner = ReplaySessionManager(Server("runner"), store)
    follower = ReplaySessionManager(Server("follower"), store)
    running = store.for_session("S", runner.replica)
    await running.open()
    assert await runner.replica.acquire("S", "7")
    first = await running.append("7", None)  # the request's priming event
    following = store.for_session("S", follower.replica)
    await end_if_lost(following, Tail("7", first))
    assert await errors_after(buffer, "S", first, "7") == []  # its lease is held: it runs
    runner.replica.release_session("S")  # the runner let go (as it does when it stops)
    await runner.replica.registry.abandon("S", "7", runner.replica.id)
    await end_if_lost(following, Tail("7", first))
    await end_if_lost(following, Tail("7", first))  # the end claim: never a second error
    (error,) = await errors_after(buffer, "S", first, "7")
    assert error.id == 7 and error.error.message == LOST_REQUEST


class _Woken:
    """The live connections of a session, as the replica sees them: what a wake-up reaches."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def wake(self, sequence: str) -> None:
        self.event.set()

    def wake_all(self) -> None:
        self.event.set()


async def test_requests_a_store_failure_stopped_are_ended_through_the_session_manager() -> None:
    """The replica holds the lease, the session manager stores the error (the Sessions role)."""
    buffer = ReplayBuffer.from_url(f"memory://leases-{uuid.uuid4().hex[:8]}")
    store = ReplayEventStore(buffer)
    manager = ReplaySessionManager(Server("outage"), store)
    view = store.for_session("S", manager.replica)
    await view.open()
    woken = _Woken()
    manager.replica.followers["S"] = woken
    async with manager.replica.run():
        assert await manager.replica.acquire("S", "call-9")
        first = await view.append("call-9", None)
        woken.event = anyio.Event()
        manager.replica.end_after_outage("S", stopped_by_store("the store refused it: OOM"))
        assert manager.replica.leases_held == 0
        with anyio.fail_after(5):
            await woken.event.wait()  # stored, then its stream woken
    (error,) = await errors_after(buffer, "S", first, "call-9")
    assert error.id == "call-9"
    assert error.error.message.startswith("request failed: the store refused it: OOM")


async def wait_in_bounded(seconds: float, refused: StorageError | None = None) -> None:
    """A store call that never returns, in a bounded block (refused first, when given)."""
    with bounded(seconds):
        if refused is not None:
            note_refusal(refused)  # an append retried while the store refuses it
        await anyio.sleep(5)


async def test_a_bounded_block_tells_what_the_store_said_when_it_runs_out() -> None:
    with pytest.raises(StorageError, match=r"did not answer within 0\.05 s") as silent:
        await wait_in_bounded(0.05)
    assert silent.value.kind == "unreachable"
    refused = StorageError("OOM command not allowed", kind="oom")
    with pytest.raises(StorageError, match="OOM command not allowed") as told:
        await wait_in_bounded(0.05, refused)
    assert told.value.kind == "oom"
    with bounded(5):  # no deadline reached: nothing raised
        note_refusal(refused)

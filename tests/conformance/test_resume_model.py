"""Model-based test of resumption per sequence: exact, or a failure an eviction justifies.

A hypothesis state machine drives one session on every backend case: several
sequences (request streams, the GET stream) appended in random interleavings,
priming events among them, a random ``max_events``, clients that hold the
last event they received on their stream and drop and resume at random, on
either of two replicas. An oracle knows every event issued and what each
client received. Every resume must be one of:

- ``resumed`` with exactly the events of the client's stream after its cursor
  (whether or not the cursor's own event is still stored): no gap, no
  duplicate, nothing of another stream;
- ``below_floor``, and only when an event of that stream *after the cursor*
  was evicted: no false refusal.

After every step the live clients hold every event of their stream, in
order, once, and ``session_info`` (floor, high-water, per-sequence state,
emptied sequences included) matches the oracle on the other replica.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from replaystore import Cursor, ReplayBuffer, SequenceInfo, UnknownSessionError, Verdict

STREAMS = ("_GET_stream", "1", "2", "3")
LIMITS = (3, 5, 8, 13)
KINDS = ("data", "data", "data", "priming")
T = TypeVar("T")


@dataclass
class Issued:
    event_id: str
    position: int
    stream: str
    payload: bytes | None


@dataclass
class Client:
    """The one client of a stream: the events it received, the id it would resume from."""

    cursor: str
    received: list[int] = field(default_factory=list)
    connected: bool = True


class Harness:
    """Buffers (two replicas per ``max_events``) on one backend case, driven from sync code."""

    def __init__(self, portal: anyio.from_thread.BlockingPortal, make: Callable[..., Any]) -> None:
        self.portal = portal
        self.make = make
        self.buffers: dict[int, list[ReplayBuffer]] = {}

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return self.portal.call(fn, *args)

    def replicas(self, max_events: int) -> list[ReplayBuffer]:
        if max_events not in self.buffers:
            self.buffers[max_events] = [self.call(self.make, max_events) for _ in range(2)]
        return self.buffers[max_events]


class ResumeMachine(RuleBasedStateMachine):
    harness: Harness  # set per backend case before the machine runs

    @initialize(max_events=st.sampled_from(LIMITS))
    def start(self, max_events: int) -> None:
        self.max_events = max_events
        self.bufs = self.harness.replicas(max_events)
        self.session = f"m-{uuid.uuid4().hex[:12]}"
        self.turn = 0
        self.refusals = 0
        self._open()

    # -- helpers ---------------------------------------------------------------

    def _buf(self) -> ReplayBuffer:
        self.turn += 1
        return self.bufs[self.turn % 2]

    def _open(self) -> None:
        info = self.harness.call(self._buf().open_session, self.session)
        assert info.high_water == 0
        self.epoch = info.epoch
        self.top = 0
        self.issued: list[Issued] = []
        self.clients: dict[str, Client] = {}

    @property
    def floor(self) -> int:
        return max(1, self.top - self.max_events + 1)

    def _stream(self, stream: str) -> list[Issued]:
        return [e for e in self.issued if e.stream == stream]

    def _expected_sequences(self) -> dict[str, SequenceInfo]:
        out: dict[str, SequenceInfo] = {}
        for stream in STREAMS:
            mine = [e.position for e in self._stream(stream)]
            kept = [p for p in mine if p >= self.floor]
            if kept:
                out[stream] = SequenceInfo(min(kept), max(kept), len(kept))
            elif mine:
                out[stream] = SequenceInfo(max(mine) + 1, max(mine), 0)
        return out

    # -- rules -------------------------------------------------------------------

    @rule(
        stream=st.sampled_from(STREAMS),
        kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=3),
    )
    def append(self, stream: str, kinds: list[str]) -> None:
        payloads = [None if k == "priming" else f"{stream}:{self.top}:{i}".encode()
                    for i, k in enumerate(kinds)]  # fmt: skip
        buf = self._buf()
        if len(payloads) == 1:
            ids = [self.harness.call(buf.append, self.session, stream, payloads[0])]
        else:
            ids = self.harness.call(buf.append_many, self.session, stream, payloads)
        for event_id, payload in zip(ids, payloads, strict=True):
            position = Cursor.parse(event_id).position
            if position == self.top + 1:
                self.top = position
                self.issued.append(Issued(event_id, position, stream, payload))
                client = self.clients.setdefault(stream, Client(event_id))
                if client.connected:  # delivered live
                    client.received.append(position)
                    client.cursor = event_id
            else:
                # Not stored again: a priming event right after a retained priming event.
                newest = self._stream(stream)[-1]
                assert payload is None and newest.payload is None, (event_id, newest)
                assert newest.position >= self.floor and newest.event_id == event_id

    @rule(stream=st.sampled_from(STREAMS))
    def disconnect(self, stream: str) -> None:
        if stream in self.clients:
            self.clients[stream].connected = False

    @precondition(lambda self: any(not c.connected for c in self.clients.values()))
    @rule(data=st.data(), named=st.booleans(), probe=st.booleans())
    def resume(self, data: st.DataObject, named: bool, probe: bool) -> None:
        stream = data.draw(
            st.sampled_from(sorted(s for s, c in self.clients.items() if not c.connected))
        )
        client = self.clients[stream]
        at = Cursor.parse(client.cursor).position
        missed = [e for e in self._stream(stream) if e.position > at]
        evicted_after = [e for e in missed if e.position < self.floor]
        buf = self._buf()
        call = buf.resolve if probe else buf.resolve_and_replay
        res = self.harness.call(call, self.session, client.cursor, stream if named else None)
        context = (stream, client.cursor, self.floor, self.top, res)
        if evicted_after:  # justified: an event of this stream after the cursor is gone
            assert res.verdict is Verdict.BELOW_FLOOR, context
            assert res.events == []
            self.refusals += 1
            if not probe:
                assert res.evidence.torn_down
                assert self.harness.call(self._buf().session_info, self.session) is None
                with pytest.raises(UnknownSessionError):
                    self.harness.call(self._buf().append, self.session, stream, b"late")
                self._open()
            return
        # nothing of this stream after the cursor is gone: never refused
        assert res.verdict is Verdict.RESUMED, context
        assert res.sequence == stream, context
        if probe:
            assert res.events == []
            return
        got = [(e.event_id, e.sequence, e.position, e.payload) for e in res.events]
        assert got == [(e.event_id, e.stream, e.position, e.payload) for e in missed], context
        client.received += [e.position for e in missed]
        client.cursor = missed[-1].event_id if missed else client.cursor
        client.connected = True

    @precondition(lambda self: len(self.clients) >= 1)
    @rule(data=st.data())
    def resume_naming_another_stream(self, data: st.DataObject) -> None:
        """A probe with the wrong stream's name (one cursor slot, several streams)."""
        stream = data.draw(st.sampled_from(sorted(self.clients)))
        other = data.draw(st.sampled_from([s for s in STREAMS if s != stream]))
        cursor = self.clients[stream].cursor
        at = Cursor.parse(cursor).position
        res = self.harness.call(self._buf().resolve, self.session, cursor, other)
        if other not in self._expected_sequences():
            assert res.verdict is Verdict.UNKNOWN_SEQUENCE, res
        elif at >= self.floor:
            assert res.verdict is Verdict.SEQUENCE_MISMATCH, res
        else:  # the other stream's newest evicted event is not at this position
            assert res.verdict is Verdict.BELOW_FLOOR, res

    # -- invariants ---------------------------------------------------------------

    @invariant()
    def clients_hold_their_stream_exactly(self) -> None:
        for stream, client in self.clients.items():
            mine = [e.position for e in self._stream(stream)]
            if client.connected:
                assert client.received == mine, (stream, client, mine)
            else:
                assert client.received == mine[: len(client.received)], (stream, client)

    @invariant()
    def bookkeeping_matches_on_the_other_replica(self) -> None:
        info = self.harness.call(self._buf().session_info, self.session)
        assert info is not None and info.epoch == self.epoch
        assert (info.floor, info.high_water) == (self.floor, self.top)
        assert info.sequences == self._expected_sequences()


# Real servers cost a round trip per call: fewer, shorter runs there.
EXAMPLES = {"memory-asyncio": 120, "memory-trio": 60, "fakeredis": 40}


def test_resumes_are_exact_or_justified(case: Any) -> None:  # the conformance `case`
    prefix = f"rm{uuid.uuid4().hex[:10]}:"
    options = case.options(prefix)

    async def make(max_events: int) -> ReplayBuffer:
        buffer = ReplayBuffer.from_url(case.url, max_events=max_events, **options)
        await buffer.__aenter__()
        return buffer

    with anyio.from_thread.start_blocking_portal(case.anyio_backend) as portal:
        harness = Harness(portal, make)
        try:
            machine = type("Machine", (ResumeMachine,), {"harness": harness})
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=EXAMPLES.get(case.name, 25),
                    stateful_step_count=40,
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow],
                ),
            )
        finally:
            for pair in harness.buffers.values():
                for buffer in pair:
                    portal.call(buffer.aclose)

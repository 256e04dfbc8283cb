"""A replay's events in columns (``Replay``): a sequence of events that builds them when asked."""

from __future__ import annotations

import pickle

import pytest

from replaystore import Replay, ReplayBuffer
from replaystore.mcp.sessions.live import _replayed
from replaystore.mcp.sessions.messages import payloads_of
from replaystore.mcp.sessions.sse import event_frame, whole_body
from replaystore.verdicts import Event

IDS = ["e-3.t.1.9", "e-5.t.2.9", "e-8.t.3.9"]
PAYLOADS: list[bytes | None] = [b'{"a":1}', b'{"b":2}', b'{"c":3}']


def _replay() -> Replay:
    return Replay(list(IDS), "s", [3, 5, 8], list(PAYLOADS))


def _events() -> list[Event]:
    return [Event(i, "s", p, d) for i, p, d in zip(IDS, [3, 5, 8], PAYLOADS, strict=True)]


def test_a_replay_is_the_sequence_of_its_events() -> None:
    replay, events = _replay(), _events()
    assert len(replay) == 3 and list(replay) == events
    assert replay == events and events == replay and replay == _replay()
    assert replay != events[:2] and replay != _replay()[:2]
    assert replay[1] == events[1] and replay[-1] == events[-1]
    assert type(replay[1]) is Event and replay[1].payload == b'{"b":2}'
    assert events[1] in replay and replay.index(events[2]) == 2
    assert list(reversed(replay)) == events[::-1]
    assert repr(replay) == repr(events)
    assert replay != tuple(events)  # as a list is not equal to a tuple
    with pytest.raises(TypeError):
        hash(replay)
    with pytest.raises(IndexError):
        replay[3]


def test_a_slice_is_a_replay_of_the_sliced_columns() -> None:
    part = _replay()[1:]
    assert type(part) is Replay
    assert (part.ids, part.positions, part.payloads) == (IDS[1:], [5, 8], PAYLOADS[1:])
    assert part == _events()[1:]
    assert _replay()[5:] == [] and len(_replay()[::2]) == 2


def test_a_replay_survives_pickling() -> None:
    replay = _replay()
    assert pickle.loads(pickle.dumps(replay)) == replay


def test_the_mcp_path_reads_the_columns_and_builds_no_event() -> None:
    replay = _replay()
    assert payloads_of(replay) is replay.payloads
    sent, last, finished = _replayed(replay, "s", "e-1.t.0.9")
    assert sent is replay and last == IDS[-1] and not finished
    assert whole_body(replay) == b"".join(map(event_frame, _events()))
    assert replay._built is None  # none of the above built an event


def test_up_to_the_response_is_a_replay_too() -> None:
    payloads: list[bytes | None] = [
        b'{"jsonrpc":"2.0","method":"notifications/progress","params":{}}',
        b'{"jsonrpc":"2.0","id":7,"result":{}}',
        b'{"jsonrpc":"2.0","method":"notifications/progress","params":{}}',
    ]
    replay = Replay(list(IDS), "7", [3, 5, 8], payloads)
    sent, last, finished = _replayed(replay, "7", "e-1.t.0.9")
    assert type(sent) is Replay and last == IDS[1] and finished
    assert replay._built is None and sent._built is None
    assert sent == list(replay)[:2]


@pytest.mark.anyio
async def test_a_resume_returns_a_replay_equal_to_its_events() -> None:
    async with ReplayBuffer.from_url("memory://") as buf:
        await buf.open_session("S")
        first = await buf.append("S", "q", b"1")
        second = await buf.append("S", "q", b"2")
        third = await buf.append("S", "q", b"3")
        res = await buf.resolve_and_replay("S", first)
        assert type(res.events) is Replay
        assert res.events == [Event(second, "q", 2, b"2"), Event(third, "q", 3, b"3")]
        res = await buf.resolve_and_replay("S", third)
        assert res.ok and res.events == []

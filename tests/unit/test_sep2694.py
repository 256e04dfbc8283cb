"""The cursor judge of ``tasks/stream``, the event-type rule and the stored form of events.

The judge is pure: facts from one read of the store (floor, next) and the
request's ``after`` in, a verdict out. Checked exhaustively on small ranges
against the draft's rules written out case by case, then on any JSON value.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replaystore.taskstore import LOST_ERROR, OUTAGE_ERROR, EventRetention, TaskEventError
from replaystore.taskstore.events import decode_event, encode_event, encode_status, event_blob
from replaystore.taskstore.sep2694 import (
    OMITTED,
    STATUS_TYPE,
    EventsGone,
    Invalid,
    Start,
    event_params,
    events_gone_data,
    judge_cursor,
    type_problem,
)


def _expected(after: int, floor: int, next_seq: int) -> object:
    """The draft's rules, one by one, for an integer cursor."""
    if after < 0 or after > next_seq - 1:
        return Invalid
    if after + 1 < floor:
        return EventsGone(floor)
    return Start(after + 1)


def test_every_integer_cursor_on_small_ranges() -> None:
    for next_seq in range(7):
        for floor in range(next_seq + 1):
            assert judge_cursor(OMITTED, floor, next_seq) == Start(floor)
            for after in range(-3, next_seq + 3):
                verdict = judge_cursor(after, floor, next_seq)
                wanted = _expected(after, floor, next_seq)
                if wanted is Invalid:
                    assert isinstance(verdict, Invalid), (after, floor, next_seq)
                else:
                    assert verdict == wanted, (after, floor, next_seq)


def test_a_resumed_stream_starts_exactly_after_its_cursor_or_not_at_all() -> None:
    # The cursor the client had: the retained range must start at or before after + 1.
    assert judge_cursor(4, 5, 9) == Start(5)
    assert judge_cursor(3, 5, 9) == EventsGone(5)
    # Nothing retained (all dropped after the end): the next seq is the earliest.
    assert judge_cursor(8, 9, 9) == Start(9)
    assert judge_cursor(2, 9, 9) == EventsGone(9)


@pytest.mark.parametrize("after", [-1, 1.5, 2.0, "3", True, False, None, [1], {"seq": 1}])
def test_a_cursor_that_is_not_a_non_negative_integer_is_invalid(after: Any) -> None:
    verdict = judge_cursor(after, 0, 10)
    assert isinstance(verdict, Invalid) and "non-negative integer" in verdict.message


def test_a_cursor_beyond_the_last_issued_seq_is_invalid() -> None:
    verdict = judge_cursor(0, 0, 0)
    assert isinstance(verdict, Invalid) and "no event was issued" in verdict.message
    verdict = judge_cursor(10, 0, 10)
    assert isinstance(verdict, Invalid) and "the last is 9" in verdict.message
    assert isinstance(judge_cursor(1 << 70, 0, 10), Invalid)


def test_inconsistent_facts_are_a_bug_not_a_verdict() -> None:
    with pytest.raises(ValueError, match="inconsistent"):
        judge_cursor(0, 5, 3)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=5,
)


@given(after=json_values, floor=st.integers(0, 50), extra=st.integers(0, 50))
def test_any_json_cursor_gets_a_verdict_and_a_start_never_skips(
    after: Any, floor: int, extra: int
) -> None:
    next_seq = floor + extra
    verdict = judge_cursor(after, floor, next_seq)
    if isinstance(verdict, Start):
        # Exactly after the cursor, inside the retained range: no gap, no duplicate.
        assert isinstance(after, int) and not isinstance(after, bool)
        assert verdict.seq == after + 1 and floor <= verdict.seq <= next_seq
    elif isinstance(verdict, EventsGone):
        assert verdict.earliest == floor and isinstance(after, int) and after + 1 < floor
    else:
        assert isinstance(verdict, Invalid)


@pytest.mark.parametrize(
    "event_type",
    ["com.example/step", "com.example.review.comment", "io.github.me/x.y", "a.b/c"],
)
def test_prefixed_types_may_be_emitted(event_type: str) -> None:
    assert type_problem(event_type) is None


@pytest.mark.parametrize(
    ("event_type", "why"),
    [
        ("step", "no vendor prefix"),
        ("content.partial", "no vendor prefix"),
        ("task.status", "no vendor prefix"),
        ("com/step", "no vendor prefix"),
        ("com.example/", "no vendor prefix"),
        ("com.example/has space", "no vendor prefix"),
        ("io.modelcontextprotocol/status", "reserved for MCP"),
        ("dev.mcp.status.x", "reserved for MCP"),
        ("", "1 to 200"),
        ("com.example/" + "x" * 200, "1 to 200"),
        (7, "a string"),
    ],
)
def test_unprefixed_and_reserved_types_are_refused(event_type: Any, why: str) -> None:
    problem = type_problem(event_type)
    assert problem is not None and why in problem


def test_an_event_is_stored_and_read_back_as_emitted() -> None:
    keep = EventRetention(max_payload=64)
    blob = event_blob("com.example/step", {"n": 3, "text": "a:b\nc"}, keep)
    event = decode_event(7, encode_event(1234, blob))
    assert (event.seq, event.type, event.payload, event.at_ms) == (
        7,
        "com.example/step",
        {"n": 3, "text": "a:b\nc"},
        1234,
    )
    with pytest.raises(TaskEventError, match="no vendor prefix"):
        event_blob("step", {}, keep)
    with pytest.raises(TaskEventError, match="JSON object"):
        event_blob("com.example/step", [1, 2], keep)
    with pytest.raises(TaskEventError, match="more than the 64"):
        event_blob("com.example/step", {"text": "x" * 100}, keep)


def test_a_status_event_carries_what_tasks_get_shows() -> None:
    event = decode_event(0, encode_status(5, "cancelled", 1, "stop: now"))
    assert (event.type, event.payload) == (
        STATUS_TYPE,
        {"status": "cancelled", "statusMessage": "stop: now"},
    )
    rerun = decode_event(3, encode_status(5, "working", 2, None))
    assert rerun.payload == {"status": "working", "attempt": 2}
    lost = decode_event(4, b"5:s:failed:1:\x00lost:1")
    outage = decode_event(4, b"5:s:failed:1:\x00lost:2")
    assert lost.payload["statusMessage"] == LOST_ERROR["message"]
    assert outage.payload["statusMessage"] == OUTAGE_ERROR["message"]


def test_the_wire_shapes() -> None:
    assert event_params("T", 2, "com.example/x", {"a": 1}) == {
        "seq": 2,
        "taskId": "T",
        "type": "com.example/x",
        "payload": {"a": 1},
        "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "T"}},
    }
    assert events_gone_data("T", 5) == {"reason": "events_gone", "taskId": "T", "earliestSeq": 5}

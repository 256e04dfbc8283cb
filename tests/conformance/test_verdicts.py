"""Every verdict, reached through the public API and checked field by field.

Runs unchanged against every backend case of ``tests/conformance/conftest.py``. The only
way around the API is ``case.damage`` (the one route to ``not_retained``).
"""

from __future__ import annotations

import json

import anyio
import pytest

from replaystore import (
    Cursor,
    ReplayStoreError,
    ResumptionDesyncError,
    SequenceInfo,
    UnknownSessionError,
    Verdict,
)
from replaystore.retention import EVICTED_SEQUENCES

from ._support import (
    after,
    append_plan,
    bare,
    check_failed,
    check_reason,
    check_resumed,
    epoch_of,
    pos,
    replica,
    triples,
)

pytestmark = pytest.mark.anyio

S = "sess-1"

# An interleaving of three sequences: a priming event, an empty payload, and
# bytes that are not UTF-8, so that payloads travel as bytes, untouched.
INTERLEAVED = [
    ("a", b"a1"),
    ("b", b"b1"),
    ("a", b"a2"),
    ("c", None),
    ("b", b"\xff\x00b2"),
    ("a", b"a3"),
    ("c", b"c2"),
    ("a", b""),
    ("b", b"b3"),
]


# -- resumed ----------------------------------------------------------------


async def test_resumed_exact_events_across_interleaved_sequences(make_buffer):
    buf = await make_buffer()
    info = await buf.open_session(S)
    log = await append_plan(buf, S, INTERLEAVED)
    assert [p for _, _, p, _ in log] == list(range(1, len(INTERLEAVED) + 1))
    assert {epoch_of(event_id) for event_id, *_ in log} == {info.epoch}

    for event_id, sequence, position, _ in log:
        expected = after(log, sequence, position)
        # unnamed: the cursor's own sequence; named correctly: the same
        for named in (None, sequence):
            res = await buf.resolve_and_replay(S, event_id, named)
            check_resumed(res, expected, sequence)
            ev = res.evidence
            assert ev.session == S
            assert ev.cursor == event_id
            assert ev.cursor_epoch == info.epoch
            assert ev.epoch == info.epoch
            assert ev.cursor_position == position
            assert ev.floor == 1
            assert ev.high_water == len(INTERLEAVED)
            assert ev.retained == len(INTERLEAVED)
            assert ev.sequence == sequence
            assert ev.sequence_floor == min(p for _, s, p, _ in log if s == sequence)
            assert ev.sequence_high_water == max(p for _, s, p, _ in log if s == sequence)
            assert ev.sequence_count == 3
            assert ev.cursor_sequence is None
            assert ev.tombstone is None
            for event in res.events:
                assert event.cursor.bare == Cursor(info.epoch, event.position)

    # one explicit case, spelled out: after a1 come a2, a3 and the empty payload
    res = await buf.resolve_and_replay(S, log[0][0], "a")
    assert [(e.position, e.payload) for e in res.events] == [(3, b"a2"), (6, b"a3"), (8, b"")]
    # successful resumes change nothing
    after_info = await buf.session_info(S)
    assert after_info is not None
    assert after_info.epoch == info.epoch
    assert after_info.high_water == len(INTERLEAVED)


async def test_resumed_with_zero_events_at_the_high_water(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    log = await append_plan(buf, S, [("a", b"1"), ("b", b"2"), ("a", b"3")])
    last_a, last_b = log[2][0], log[1][0]
    for cursor, sequence in ((last_a, "a"), (last_b, "b")):
        res = await buf.resolve_and_replay(S, cursor)
        check_resumed(res, [], sequence)
        assert res.evidence.replayed == 0
        assert res.evidence.sequence_high_water == pos(cursor)
    # the session is intact: a later event is then replayed from the same cursor
    new = await buf.append(S, "a", b"4")
    res = await buf.resolve_and_replay(S, last_a, "a")
    check_resumed(res, [(new, "a", 4, b"4")], "a")


async def test_priming_events_take_positions_and_replay_without_payload(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    priming = await buf.append(S, "stream", None)
    first = await buf.append(S, "stream", b"first")
    more = await buf.append_many(S, "stream", [None, b"", None])
    assert [pos(i) for i in [priming, first, *more]] == [1, 2, 3, 4, 5]

    origin = (await buf.session_info(S)).origin
    res = await buf.resolve_and_replay(S, str(origin))
    check_resumed(
        res,
        [
            (priming, "stream", 1, None),
            (first, "stream", 2, b"first"),
            (more[0], "stream", 3, None),
            (more[1], "stream", 4, b""),  # empty bytes are not a priming event
            (more[2], "stream", 5, None),
        ],
        "stream",
    )
    # a client primed with the priming event's id resumes right after it
    res = await buf.resolve_and_replay(S, priming)
    assert [(e.position, e.payload) for e in res.events] == [
        (2, b"first"),
        (3, None),
        (4, b""),
        (5, None),
    ]
    res = await buf.resolve_and_replay(S, more[2])
    check_resumed(res, [], "stream")


# -- origin -------------------------------------------------------------------


async def test_origin_of_empty_session_resumes_with_nothing(make_buffer):
    buf = await make_buffer()
    info = await buf.open_session(S)
    assert info.origin == Cursor(info.epoch, 0)
    assert str(info.origin) == f"{info.epoch}-0"
    res = await buf.resolve_and_replay(S, str(info.origin))
    check_resumed(res, [], None)
    assert res.evidence.high_water == 0
    assert await buf.session_info(S) is not None


async def test_origin_replays_a_single_sequence_whole(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    log = await append_plan(buf, S, [("only", b"x"), ("only", None), ("only", b"z")])
    origin = str((await buf.session_info(S)).origin)
    for named in (None, "only"):
        res = await buf.resolve_and_replay(S, origin, named)
        check_resumed(res, log, "only")
        assert res.evidence.cursor_position == 0


async def test_the_origin_cursor_object_is_accepted_as_it_is(make_buffer):
    """``SessionInfo.origin`` is a ``Cursor``: passed as it is, it resumes like its text."""
    buf = await make_buffer()
    await buf.open_session(S)
    log = await append_plan(buf, S, [("only", b"x"), ("only", b"y")])
    origin = (await buf.session_info(S)).origin
    assert isinstance(origin, Cursor)
    probe = await buf.resolve(S, origin)
    assert probe.verdict is Verdict.RESUMED
    res = await buf.resolve_and_replay(S, origin, "only")
    check_resumed(res, log, "only")
    assert res.evidence.cursor == str(origin)
    # Any cursor object: the same verdict as its text.
    res = await buf.resolve_and_replay(S, Cursor.parse(log[0][0]))
    check_resumed(res, log[1:], "only")


async def test_origin_with_two_sequences_needs_a_name(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    log = await append_plan(buf, S, INTERLEAVED[:5])  # a, b, a, c, b
    origin = str((await buf.session_info(S)).origin)

    for seq in ("a", "b", "c"):
        res = await buf.resolve_and_replay(S, origin, seq)
        check_resumed(res, after(log, seq, 0), seq)

    probe = await buf.resolve(S, origin)
    check_failed(probe, Verdict.AMBIGUOUS_SEQUENCE, torn_down=False)
    assert probe.verdict.value == "ambiguous_sequence"
    assert probe.evidence.sequence is None
    assert probe.evidence.sequence_count == 3
    assert probe.evidence.cursor_position == 0

    res = await buf.resolve_and_replay(S, origin)
    check_failed(res, Verdict.AMBIGUOUS_SEQUENCE, torn_down=True)
    assert await buf.session_info(S) is None


async def test_origin_after_eviction_is_below_floor(make_buffer):
    buf = await make_buffer(max_events=3)
    await buf.open_session(S)
    await append_plan(buf, S, [("a", b"1"), ("a", b"2"), ("a", b"3"), ("a", b"4")])
    origin = str((await buf.session_info(S)).origin)
    for named in (None, "a"):
        res = await buf.resolve(S, origin, named)
        check_failed(res, Verdict.BELOW_FLOOR, torn_down=False)
        assert res.evidence.floor == 2
        assert res.evidence.cursor_position == 0
    res = await buf.resolve_and_replay(S, origin, "a")
    check_failed(res, Verdict.BELOW_FLOOR, torn_down=True)


# -- the proxy reconnect scenario -------------------------------------------


async def test_seed_scenario_sub_stream_and_top_level_cursors(make_buffer):
    """The proxy scenario: a top-level cursor 3120, a sub-stream cursor 4471, count
    retention that evicted everything <= 4400. Each cursor resumes exactly its
    own sequence or fails loudly; the top-level cursor is never clamped."""
    buf = await make_buffer(max_events=72)
    info = await buf.open_session("S")

    def body(sequence: str, position: int) -> bytes:
        return f"{sequence}@{position}".encode()

    top = await buf.append_many(
        "S", "_GET_stream", [body("_GET_stream", p) for p in range(1, 3121)]
    )
    top_cursor = top[-1]
    assert bare(top_cursor) == f"{info.epoch}-3120"
    tool = await buf.append_many("S", "tool-7", [body("tool-7", p) for p in range(3121, 4451)])
    progress = await buf.append("S", "_GET_stream", b'{"method":"notifications/progress"}')
    assert pos(progress) == 4451
    tool += await buf.append_many("S", "tool-7", [body("tool-7", p) for p in range(4452, 4472)])
    sub_cursor = tool[-1]
    assert bare(sub_cursor) == f"{info.epoch}-4471"
    final = await buf.append("S", "_GET_stream", b'{"result":"done"}')
    assert pos(final) == 4472

    snap = await buf.session_info("S")
    assert (snap.floor, snap.high_water, snap.retained) == (4401, 4472, 72)
    assert snap.sequences == {
        "tool-7": SequenceInfo(4401, 4471, 70),
        "_GET_stream": SequenceInfo(4451, 4472, 2),
    }

    # the sub-stream cursor resumes exactly (nothing missed), with or without its name
    for named in (None, "tool-7"):
        check_resumed(await buf.resolve_and_replay("S", sub_cursor, named), [], "tool-7")
    # from inside the retained window: only tool-7's events, the progress
    # notification (another sequence) is not mixed in
    mid = f"{info.epoch}-4420"
    expected = [
        (f"{info.epoch}-{p}", "tool-7", p, body("tool-7", p))
        for p in [*range(4421, 4451), *range(4452, 4472)]
    ]
    check_resumed(await buf.resolve_and_replay("S", mid, "tool-7"), expected, "tool-7")
    # the floor itself is still retained
    res = await buf.resolve_and_replay("S", f"{info.epoch}-4401")
    assert res.ok
    assert [e.position for e in res.events] == [p for p in range(4402, 4472) if p != 4451]
    # the top-level stream resumes from its own retained events
    res = await buf.resolve_and_replay("S", progress, "_GET_stream")
    check_resumed(res, [(final, "_GET_stream", 4472, b'{"result":"done"}')], "_GET_stream")

    # naming the wrong sequence for the sub-stream cursor
    res = await buf.resolve("S", sub_cursor, "_GET_stream")
    check_failed(res, Verdict.SEQUENCE_MISMATCH, torn_down=False)
    assert res.evidence.sequence == "_GET_stream"
    assert res.evidence.cursor_sequence == "tool-7"
    assert res.evidence.cursor_position == 4471

    # The top-level cursor's own event is gone, but it is the newest evicted
    # event of its sequence: nothing of "_GET_stream" after it was evicted, so
    # the resume is exact (the progress notification and the result), never
    # a replay clamped to the floor and never tool-7's events.
    missed = [
        (progress, "_GET_stream", 4451, b'{"method":"notifications/progress"}'),
        (final, "_GET_stream", 4472, b'{"result":"done"}'),
    ]
    for named in (None, "_GET_stream"):
        check_resumed(await buf.resolve_and_replay("S", top_cursor, named), missed, "_GET_stream")
    # below the floor and not the newest evicted event of the sequence
    # (named, or hinted by the cursor): an event of it after the cursor is gone
    for cursor, named in [
        (top_cursor, "tool-7"),
        (top[-2], None),
        (top[-2], "_GET_stream"),
        (f"{info.epoch}-4400", None),  # no hint, no name: nothing attributes it
        (f"{info.epoch}-4400", "_GET_stream"),
        (f"{info.epoch}-1", "_GET_stream"),
        (tool[0], "tool-7"),
    ]:
        res = await buf.resolve("S", cursor, named)
        check_failed(res, Verdict.BELOW_FLOOR, torn_down=False)
        assert res.evidence.floor == 4401
        assert res.evidence.high_water == 4472
        assert res.evidence.cursor_position == pos(cursor)

    res = await buf.resolve_and_replay("S", top[-2], "_GET_stream")
    check_failed(res, Verdict.BELOW_FLOOR, torn_down=True)
    assert res.evidence.floor == 4401
    assert res.evidence.cursor_position == 3119
    assert res.evidence.cursor == top[-2]
    # fail closed: the session is gone, the client must re-initialize
    assert await buf.session_info("S") is None
    gone = await buf.resolve_and_replay("S", sub_cursor, "tool-7")
    check_failed(gone, Verdict.UNKNOWN_SESSION, torn_down=False)
    assert gone.evidence.tombstone is not None
    assert gone.evidence.tombstone.verdict is Verdict.BELOW_FLOOR


async def test_seed_scenario_wrong_name_tears_down(make_buffer):
    buf = await make_buffer(max_events=5)
    await buf.open_session("S")
    await buf.append_many("S", "_GET_stream", [b"t1", b"t2"])
    tool = await buf.append_many("S", "tool-7", [b"x1", b"x2", b"x3", b"x4"])
    await buf.append("S", "_GET_stream", b"progress")
    res = await buf.resolve_and_replay("S", tool[-1], "_GET_stream")
    check_failed(res, Verdict.SEQUENCE_MISMATCH, torn_down=True)
    assert res.evidence.cursor_sequence == "tool-7"
    assert res.evidence.sequence == "_GET_stream"
    with pytest.raises(UnknownSessionError):
        await buf.append("S", "tool-7", b"late")


# -- unknown_session ----------------------------------------------------------


async def test_unknown_session_never_opened(make_buffer):
    buf = await make_buffer()
    res = await buf.resolve_and_replay("never-opened", "0123456789ab-1")
    check_failed(res, Verdict.UNKNOWN_SESSION, torn_down=False)
    assert res.verdict.value == "unknown_session"
    assert res.evidence.session == "never-opened"
    assert res.evidence.tombstone is None
    assert res.evidence.cursor == "0123456789ab-1"
    assert await buf.session_info("never-opened") is None
    probe = await buf.resolve("never-opened", "0123456789ab-1")
    check_failed(probe, Verdict.UNKNOWN_SESSION, torn_down=False)


async def test_unknown_session_after_close(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    ids = await buf.append_many(S, "a", [b"1", b"2"])
    assert await buf.close_session(S) is True
    assert await buf.close_session(S) is False  # already gone
    res = await buf.resolve_and_replay(S, ids[0])
    check_failed(res, Verdict.UNKNOWN_SESSION, torn_down=False)
    tomb = res.evidence.tombstone
    assert tomb is not None
    assert tomb.verdict is None
    assert "closed" in tomb.reason
    assert "closed" in res.evidence.reason
    assert tomb.at > 0
    assert await buf.session_info(S) is None
    with pytest.raises(UnknownSessionError) as err:
        await buf.append(S, "a", b"3")
    assert err.value.session == S


async def test_unknown_session_after_teardown_carries_the_failed_verdict(make_buffer):
    buf = await make_buffer()
    info = await buf.open_session(S)
    await buf.append(S, "a", b"1")
    failed = await buf.resolve_and_replay(S, f"{info.epoch}-99")
    check_failed(failed, Verdict.AHEAD_OF_HIGH_WATER, torn_down=True)
    res = await buf.resolve_and_replay(S, f"{info.epoch}-1")
    check_failed(res, Verdict.UNKNOWN_SESSION, torn_down=False)
    tomb = res.evidence.tombstone
    assert tomb is not None
    assert tomb.verdict is Verdict.AHEAD_OF_HIGH_WATER
    assert tomb.reason == failed.evidence.reason
    assert res.evidence.reason != tomb.reason  # "torn down", not the original failure
    # the evidence serializes (HTTP error bodies, logs)
    body = json.loads(json.dumps(res.evidence.as_dict()))
    assert body["tombstone"]["verdict"] == "ahead_of_high_water"
    assert "torn_down" not in body


@pytest.mark.parametrize(
    "session",
    ["", " ", "with space", "x" * 257, "caf\u00e9", "tab\there", "nul\x00", None, 42, b"bytes"],
    ids=lambda v: repr(v)[:24],
)
async def test_unknown_session_for_an_invalid_session_id(make_buffer, session):
    buf = await make_buffer()
    await buf.open_session(S)
    await buf.append(S, "a", b"1")
    for resolve in (buf.resolve_and_replay, buf.resolve):
        res = await resolve(session, "0123456789ab-1")
        check_failed(res, Verdict.UNKNOWN_SESSION, torn_down=False)
        assert res.evidence.tombstone is None
    assert await buf.session_info(session) is None
    assert (await buf.session_info(S)).high_water == 1  # other sessions untouched


# -- foreign_cursor -------------------------------------------------------------


async def test_foreign_cursor_from_another_session(make_buffer):
    buf = await make_buffer()
    mine = await buf.open_session("mine")
    other = await buf.open_session("other")
    assert mine.epoch != other.epoch
    await buf.append_many("mine", "a", [b"1", b"2", b"3"])
    theirs = await buf.append_many("other", "a", [b"x", b"y"])
    # same position, same sequence name, other session: never replayed here
    probe = await buf.resolve("mine", theirs[0], "a")
    check_failed(probe, Verdict.FOREIGN_CURSOR, torn_down=False)
    assert probe.verdict.value == "foreign_cursor"
    assert probe.evidence.cursor_epoch == other.epoch
    assert probe.evidence.epoch == mine.epoch
    assert probe.evidence.cursor_position == 1
    res = await buf.resolve_and_replay("mine", theirs[0], "a")
    check_failed(res, Verdict.FOREIGN_CURSOR, torn_down=True)
    # the other session is not affected
    check_resumed(
        await buf.resolve_and_replay("other", theirs[0]), [(theirs[1], "a", 2, b"y")], "a"
    )


@pytest.mark.parametrize("end", ["close", "teardown"])
async def test_foreign_cursor_from_an_earlier_incarnation(make_buffer, end):
    buf = await make_buffer()
    first = await buf.open_session(S)
    old = await buf.append_many(S, "a", [b"old1", b"old2", b"old3"])
    if end == "close":
        assert await buf.close_session(S)
    else:
        assert not (await buf.resolve_and_replay(S, "garbage")).ok
    second = await buf.open_session(S)
    assert second.epoch != first.epoch
    assert (second.high_water, second.retained, second.floor) == (0, 0, 1)
    new = await buf.append_many(S, "a", [b"new1", b"new2", b"new3", b"new4"])
    # the same positions exist again, but they are other events
    assert [pos(i) for i in new[:3]] == [pos(i) for i in old]
    probe = await buf.resolve(S, old[0], "a")
    check_failed(probe, Verdict.FOREIGN_CURSOR, torn_down=False)
    assert probe.evidence.cursor_epoch == first.epoch
    assert probe.evidence.epoch == second.epoch
    res = await buf.resolve_and_replay(S, old[1])
    check_failed(res, Verdict.FOREIGN_CURSOR, torn_down=True)


async def test_open_session_is_idempotent_for_a_live_session(make_buffer):
    buf = await make_buffer()
    first = await buf.open_session(S)
    assert (first.session, first.high_water, first.retained, first.floor) == (S, 0, 0, 1)
    assert first.sequences == {}
    ids = await buf.append_many(S, "a", [b"1", b"2"])
    again = await buf.open_session(S)
    assert again.epoch == first.epoch
    assert (again.high_water, again.retained, again.floor) == (2, 2, 1)
    assert again.sequences == {"a": SequenceInfo(1, 2, 2)}
    check_resumed(await buf.resolve_and_replay(S, ids[0]), [(ids[1], "a", 2, b"2")], "a")
    assert pos(await buf.append(S, "a", b"3")) == 3


# -- ahead_of_high_water, unknown_sequence -------------------------------------


async def test_ahead_of_high_water(make_buffer):
    buf = await make_buffer()
    info = await buf.open_session(S)
    await buf.append_many(S, "a", [b"1", b"2", b"3"])
    for position in (4, 5, 10**14 - 1):
        cursor = f"{info.epoch}-{position}"
        for named in (None, "a"):
            res = await buf.resolve(S, cursor, named)
            check_failed(res, Verdict.AHEAD_OF_HIGH_WATER, torn_down=False)
            assert res.verdict.value == "ahead_of_high_water"
            assert res.evidence.high_water == 3
            assert res.evidence.cursor_position == position
    res = await buf.resolve_and_replay(S, f"{info.epoch}-4")
    check_failed(res, Verdict.AHEAD_OF_HIGH_WATER, torn_down=True)
    assert res.evidence.high_water == 3


@pytest.mark.parametrize(
    "hint", ["zzz", "A", "a ", "a\x00", "\x00", "", "x" * 300, 7, b"a"], ids=lambda v: repr(v)[:24]
)
async def test_unknown_sequence(make_buffer, hint):
    buf = await make_buffer()
    await buf.open_session(S)
    ids = await buf.append_many(S, "a", [b"1", b"2"])
    origin = str((await buf.session_info(S)).origin)
    for cursor in (ids[0], origin):
        res = await buf.resolve(S, cursor, hint)
        check_failed(res, Verdict.UNKNOWN_SEQUENCE, torn_down=False)
        assert res.verdict.value == "unknown_sequence"
        if hint in ("zzz", "A", "a "):
            assert res.evidence.sequence == hint
        assert res.evidence.sequence_floor is None
    res = await buf.resolve_and_replay(S, ids[0], hint)
    check_failed(res, Verdict.UNKNOWN_SEQUENCE, torn_down=True)
    assert await buf.session_info(S) is None


async def test_fully_evicted_sequence_is_still_known(make_buffer):
    """A sequence whose every event was evicted is not "empty": its state says what it
    issued, so its newest event resumes (nothing missed) and any older one fails."""
    buf = await make_buffer(max_events=2)
    await buf.open_session(S)
    early = await buf.append_many(S, "early", [b"e1", b"e2"])
    await buf.append_many(S, "late", [b"1", b"2"])
    info = await buf.session_info(S)
    assert info.sequences["early"] == SequenceInfo(3, 2, 0)
    assert info.sequences["late"] == SequenceInfo(3, 4, 2)
    for named in (None, "early"):
        check_resumed(await buf.resolve(S, early[-1], named), [], "early")
        check_failed(await buf.resolve(S, early[0], named), Verdict.BELOW_FLOOR, torn_down=False)
    # the origin: events are gone
    res = await buf.resolve(S, str(info.origin), "early")
    check_failed(res, Verdict.BELOW_FLOOR, torn_down=False)
    # it goes on where it stopped: the client at its newest event gets exactly the new one
    more = await buf.append(S, "early", b"e3")
    assert Cursor.parse(more).ordinal == 2
    res = await buf.resolve_and_replay(S, early[-1], "early")
    check_resumed(res, [(more, "early", 5, b"e3")], "early")
    assert (await buf.session_info(S)).sequences["early"] == SequenceInfo(5, 5, 1)


# -- not_retained (storage damaged behind the backend's back) ------------------


async def test_not_retained_when_an_event_after_the_cursor_is_lost(make_buffer, case):
    buf = await make_buffer()
    await buf.open_session(S)
    log = await append_plan(buf, S, INTERLEAVED)  # a at 1, 3, 6, 8
    await case.damage(buf, S, 3)
    for named in (None, "a"):  # a1: the chain runs through 3
        res = await buf.resolve(S, log[0][0], named)
        check_failed(res, Verdict.NOT_RETAINED, torn_down=False)
        assert res.verdict.value == "not_retained"
        assert res.evidence.sequence == "a"
        assert res.evidence.cursor_position == 1
    origin = str((await buf.session_info(S)).origin)
    check_failed(await buf.resolve(S, origin, "a"), Verdict.NOT_RETAINED, torn_down=False)
    # the gap lies before this cursor: nothing is missing after it
    check_resumed(await buf.resolve_and_replay(S, log[5][0]), [log[7]], "a")  # a3 -> a4
    # other sequences are unaffected
    check_resumed(await buf.resolve_and_replay(S, log[1][0]), after(log, "b", 2), "b")
    res = await buf.resolve_and_replay(S, log[0][0], "a")
    check_failed(res, Verdict.NOT_RETAINED, torn_down=True)
    assert await buf.session_info(S) is None


async def test_not_retained_when_the_cursor_event_is_lost(make_buffer, case):
    buf = await make_buffer()
    await buf.open_session(S)
    log = await append_plan(buf, S, INTERLEAVED)
    await case.damage(buf, S, 3)  # a2
    for named in (None, "a", "b"):  # a missing event is checked before the name
        res = await buf.resolve(S, log[2][0], named)
        check_failed(res, Verdict.NOT_RETAINED, torn_down=False)
        assert res.evidence.cursor_position == 3
    res = await buf.resolve_and_replay(S, log[2][0])
    check_failed(res, Verdict.NOT_RETAINED, torn_down=True)


async def test_not_retained_when_the_last_event_is_lost(make_buffer, case):
    buf = await make_buffer()
    await buf.open_session(S)
    ids = await buf.append_many(S, "a", [b"1", b"2", b"3"])
    await case.damage(buf, S, 3)
    res = await buf.resolve(S, ids[0])
    check_failed(res, Verdict.NOT_RETAINED, torn_down=False)
    origin = str((await buf.session_info(S)).origin)
    check_failed(await buf.resolve(S, origin), Verdict.NOT_RETAINED, torn_down=False)


async def test_not_retained_from_origin_when_the_first_event_is_lost(make_buffer, case):
    buf = await make_buffer()
    await buf.open_session(S)
    ids = await buf.append_many(S, "a", [b"1", b"2"])
    origin = str((await buf.session_info(S)).origin)
    await case.damage(buf, S, 1)
    for named in (None, "a"):
        check_failed(await buf.resolve(S, origin, named), Verdict.NOT_RETAINED, torn_down=False)
    check_resumed(await buf.resolve(S, ids[1]), [], "a")


# -- fail closed ----------------------------------------------------------------


FAILURES = [
    "malformed_cursor",
    "foreign_cursor",
    "below_floor",
    "ahead_of_high_water",
    "ambiguous_sequence",
    "unknown_sequence",
    "sequence_mismatch",
    "not_retained",
]


async def _provoke(buf, case, kind: str) -> tuple[str, str | None]:
    """Set session S up on ``buf`` and return a (cursor, name) that fails with ``kind``."""
    info = await buf.open_session(S)
    a = await buf.append_many(S, "a", [b"a1", b"a2", b"a3"])
    b = await buf.append_many(S, "b", [b"b1", b"b2"])
    await buf.append_many(S, "a", [b"a4", b"a5"])  # max_events=6: position 1 evicted
    if kind == "malformed_cursor":
        return "4471", None
    if kind == "foreign_cursor":
        return "0123456789ab-2" if info.epoch != "0123456789ab" else "ba9876543210-2", None
    if kind == "below_floor":
        await buf.append(S, "b", b"b3")  # a2 evicted after a1
        return a[0], "a"
    if kind == "ahead_of_high_water":
        return f"{info.epoch}-8", None
    if kind == "ambiguous_sequence":
        # the origin is below the floor here, so use a fresh session for ambiguity
        raise AssertionError("handled by the caller")
    if kind == "unknown_sequence":
        return a[1], "nope"
    if kind == "sequence_mismatch":
        return b[0], "a"
    if kind == "not_retained":
        await case.damage(buf, S, 6)  # a4, in the chain after a2
        return a[1], None
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", FAILURES)
async def test_failed_resolve_tears_the_session_down_for_every_replica(make_buffer, case, kind):
    one = await make_buffer(max_events=6)
    two = await replica(make_buffer, one)
    if kind == "ambiguous_sequence":
        info = await one.open_session(S)
        await one.append(S, "a", b"a1")
        await one.append(S, "b", b"b1")
        cursor, named = str(info.origin), None
    else:
        cursor, named = await _provoke(one, case, kind)
    before = await two.session_info(S)
    assert before is not None, "the replica must see the session before the failure"

    # a probe on either replica: same verdict, nothing torn down, no events
    for buf in (one, two):
        probe = await buf.resolve(S, cursor, named)
        check_failed(probe, Verdict(kind), torn_down=False)
    assert await two.session_info(S) == before

    res = await one.resolve_and_replay(S, cursor, named)
    check_failed(res, Verdict(kind), torn_down=True)
    assert res.verdict.value == kind

    for buf in (one, two):
        assert await buf.session_info(S) is None
        with pytest.raises(UnknownSessionError):
            await buf.append(S, "a", b"after")
        with pytest.raises(UnknownSessionError):
            await buf.append_many(S, "b", [b"x", None])
        gone = await buf.resolve_and_replay(S, cursor, named)
        check_failed(gone, Verdict.UNKNOWN_SESSION, torn_down=False)
        assert gone.evidence.tombstone is not None
        assert gone.evidence.tombstone.verdict is Verdict(kind)
    # only a fresh open (a new incarnation) brings it back
    reborn = await two.open_session(S)
    assert reborn.epoch != before.epoch
    assert reborn.high_water == 0


@pytest.mark.parametrize("kind", FAILURES)
async def test_teardown_on_failure_off_keeps_the_session(make_buffer, case, kind):
    buf = await make_buffer(max_events=6, teardown_on_failure=False)
    if kind == "ambiguous_sequence":
        info = await buf.open_session(S)
        await buf.append(S, "a", b"a1")
        await buf.append(S, "b", b"b1")
        cursor, named = str(info.origin), None
    else:
        cursor, named = await _provoke(buf, case, kind)
    before = await buf.session_info(S)
    for _ in range(2):
        res = await buf.resolve_and_replay(S, cursor, named)
        check_failed(res, Verdict(kind), torn_down=False)
    assert (await buf.session_info(S)).epoch == before.epoch
    new = await buf.append(S, "b", b"still-alive")
    assert pos(new) == before.high_water + 1


async def test_probe_matches_replay_but_changes_nothing(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    log = await append_plan(buf, S, INTERLEAVED)
    before = await buf.session_info(S)
    for event_id, sequence, position, _ in log:
        probe = await buf.resolve(S, event_id)
        assert probe.verdict is Verdict.RESUMED
        assert probe.ok
        assert probe.sequence == sequence
        assert probe.events == []  # a probe never replays
        assert probe.evidence.torn_down is False
        full = await buf.resolve_and_replay(S, event_id)
        assert full.verdict is probe.verdict
        assert triples(full) == after(log, sequence, position)
        assert full.evidence.floor == probe.evidence.floor
        assert full.evidence.high_water == probe.evidence.high_water
        assert full.evidence.sequence_high_water == probe.evidence.sequence_high_water
    assert await buf.session_info(S) == before


async def test_evidence_replayed_counts_returned_events(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    ids = await buf.append_many(S, "a", [b"1", b"2", b"3"])
    probe = await buf.resolve(S, ids[0])
    full = await buf.resolve_and_replay(S, ids[0])
    assert len(full.events) == 2
    assert full.evidence.replayed == 2
    assert probe.events == []
    # the same field must mean the same on every backend: events returned
    assert probe.evidence.replayed == 0


async def test_raise_for_verdict(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    ids = await buf.append_many(S, "a", [b"1", b"2"])
    ok = await buf.resolve_and_replay(S, ids[0])
    assert ok.raise_for_verdict() is ok
    bad = await buf.resolve_and_replay(S, "not-a-cursor")
    with pytest.raises(ResumptionDesyncError) as err:
        bad.raise_for_verdict()
    assert err.value.resumption is bad
    assert err.value.verdict is Verdict.MALFORMED_CURSOR
    assert "malformed_cursor" in str(err.value)
    assert isinstance(err.value, ReplayStoreError)
    assert isinstance(err.value, RuntimeError)


@pytest.mark.parametrize(
    "kind",
    [
        "malformed_beats_unknown_sequence",
        "foreign_beats_unknown_sequence",
        "unknown_sequence_beats_ahead",
        "below_floor_beats_mismatch",
        "origin_below_floor_beats_unknown_name",
    ],
)
async def test_rule_order(make_buffer, kind):
    buf = await make_buffer(max_events=4)
    info = await buf.open_session(S)
    ids = await buf.append_many(S, "a", [b"1", b"2", b"3"])
    await buf.append_many(S, "b", [b"4", b"5"])  # position 1 evicted
    cursor, named, verdict = {
        "malformed_beats_unknown_sequence": ("junk", "nope", Verdict.MALFORMED_CURSOR),
        "foreign_beats_unknown_sequence": (
            ("ffffffffffff" if info.epoch != "ffffffffffff" else "000000000000") + "-2",
            "nope",
            Verdict.FOREIGN_CURSOR,
        ),
        "unknown_sequence_beats_ahead": (f"{info.epoch}-99", "nope", Verdict.UNKNOWN_SEQUENCE),
        "below_floor_beats_mismatch": (ids[0], "b", Verdict.BELOW_FLOOR),
        "origin_below_floor_beats_unknown_name": (str(info.origin), "a", Verdict.BELOW_FLOOR),
    }[kind]
    check_failed(await buf.resolve(S, cursor, named), verdict, torn_down=False)
    check_failed(await buf.resolve_and_replay(S, cursor, named), verdict, torn_down=True)


async def test_malformed_cursor(make_buffer):
    buf = await make_buffer()
    info = await buf.open_session(S)
    await buf.append(S, "a", b"1")
    # (an upper-case hex digit: the epoch itself may be all digits)
    upper = f"{info.epoch[:-1]}A-1"
    for cursor in ("", "4471", f"{info.epoch}-01", f" {info.epoch}-1", upper):
        res = await buf.resolve(S, cursor)
        check_failed(res, Verdict.MALFORMED_CURSOR, torn_down=False)
        assert res.verdict.value == "malformed_cursor"
        assert res.evidence.cursor == cursor
        assert res.evidence.cursor_epoch is None
        assert res.evidence.cursor_position is None
        assert res.evidence.epoch == info.epoch
    res = await buf.resolve_and_replay(S, "4471")
    check_failed(res, Verdict.MALFORMED_CURSOR, torn_down=True)


# -- bookkeeping: session_info after eviction ---------------------------------


async def test_session_info_exact_after_count_eviction(make_buffer):
    buf = await make_buffer(max_events=5)
    await buf.open_session(S)
    log = await append_plan(
        buf, S, [("a", b"1"), ("a", b"2"), ("a", b"3"), ("b", b"4"), ("b", b"5")]
    )
    log += await append_plan(buf, S, [("a", b"6"), ("a", None)])
    info = await buf.session_info(S)
    assert (info.floor, info.high_water, info.retained) == (3, 7, 5)
    assert info.sequences == {"a": SequenceInfo(3, 7, 3), "b": SequenceInfo(4, 5, 2)}
    log += await append_plan(buf, S, [("b", b"8"), ("b", b"9"), ("b", b"10")])
    info = await buf.session_info(S)
    assert (info.floor, info.high_water, info.retained) == (6, 10, 5)
    assert info.sequences == {"a": SequenceInfo(6, 7, 2), "b": SequenceInfo(8, 10, 3)}
    # b's chain now starts at 8: its older cursors are below the floor, except
    # its newest evicted event (5), after which nothing of b is gone
    check_failed(await buf.resolve(S, log[3][0]), Verdict.BELOW_FLOOR, torn_down=False)
    check_resumed(await buf.resolve(S, log[4][0], "b"), [], "b")  # a bare id: named
    check_resumed(await buf.resolve_and_replay(S, log[5][0]), [log[6]], "a")
    check_resumed(await buf.resolve_and_replay(S, log[7][0]), after(log, "b", 8), "b")
    await buf.append_many(S, "c", [b"c"] * 5)
    info = await buf.session_info(S)
    assert (info.floor, info.high_water, info.retained) == (11, 15, 5)
    # a and b are emptied: still known, nothing retained
    assert info.sequences == {
        "a": SequenceInfo(8, 7, 0),
        "b": SequenceInfo(11, 10, 0),
        "c": SequenceInfo(11, 15, 5),
    }


async def test_session_info_exact_after_age_eviction(make_buffer):
    buf = await make_buffer(max_age=0.3)
    await buf.open_session(S)
    old = await append_plan(buf, S, [("a", b"1"), ("gone", b"2"), ("b", b"3"), ("a", b"4")])
    await anyio.sleep(0.5)
    new = await append_plan(buf, S, [("a", b"5"), ("b", b"6"), ("a", b"7")])
    info = await buf.session_info(S)
    assert (info.floor, info.high_water, info.retained) == (5, 7, 3)
    assert info.sequences == {
        "a": SequenceInfo(5, 7, 2),
        "b": SequenceInfo(6, 6, 1),
        "gone": SequenceInfo(3, 2, 0),
    }
    check_resumed(await buf.resolve_and_replay(S, new[0][0]), [new[2]], "a")
    # a's newest aged-out event: nothing of a after it is gone
    check_resumed(await buf.resolve_and_replay(S, old[3][0], "a"), [new[0], new[2]], "a")
    check_failed(await buf.resolve(S, old[0][0], "a"), Verdict.BELOW_FLOOR, torn_down=False)
    res = await buf.resolve(S, new[0][0], "gone")
    check_failed(res, Verdict.SEQUENCE_MISMATCH, torn_down=False)
    # everything ages out: nothing retained, floor one past the high-water
    await anyio.sleep(0.5)
    info = await buf.session_info(S)
    assert info is not None
    assert (info.floor, info.high_water, info.retained) == (8, 7, 0)
    assert {name: s.retained for name, s in info.sequences.items()} == {"a": 0, "b": 0, "gone": 0}
    # an idle client at a's newest event missed nothing
    check_resumed(await buf.resolve_and_replay(S, new[2][0], "a"), [], "a")
    res = await buf.resolve_and_replay(S, new[0][0])
    check_failed(res, Verdict.BELOW_FLOOR, torn_down=True)


async def test_session_ttl_expiry_makes_the_session_unknown(make_buffer):
    buf = await make_buffer(session_ttl=0.3)
    await buf.open_session(S)
    ids = await buf.append_many(S, "a", [b"1", b"2"])
    await anyio.sleep(0.5)
    assert await buf.session_info(S) is None
    res = await buf.resolve_and_replay(S, ids[0])
    check_failed(res, Verdict.UNKNOWN_SESSION, torn_down=False)
    assert res.evidence.tombstone is None
    with pytest.raises(UnknownSessionError):
        await buf.append(S, "a", b"3")
    reborn = await buf.open_session(S)
    assert reborn.high_water == 0


async def test_tombstone_expires_after_tombstone_ttl(make_buffer):
    buf = await make_buffer(tombstone_ttl=0.3)
    await buf.open_session(S)
    await buf.open_session("other")
    first = await buf.append(S, "a", b"1")
    await buf.append("other", "a", b"1")
    assert await buf.close_session(S)
    torn = await buf.resolve_and_replay("other", "junk")
    check_failed(torn, Verdict.MALFORMED_CURSOR, torn_down=True)
    assert (await buf.resolve(S, first)).evidence.tombstone is not None
    assert (await buf.resolve("other", first)).evidence.tombstone is not None
    await anyio.sleep(0.5)
    for session in (S, "other"):
        res = await buf.resolve_and_replay(session, first)
        check_failed(res, Verdict.UNKNOWN_SESSION, torn_down=False)
        assert res.evidence.tombstone is None
        assert res.evidence.reason == (await buf.resolve("never", first)).evidence.reason


async def test_activity_keeps_a_session_alive(make_buffer):
    buf = await make_buffer(session_ttl=0.8)
    await buf.open_session(S)
    first = await buf.append(S, "a", b"1")
    await anyio.sleep(0.5)
    second = await buf.append(S, "a", b"2")  # refreshes the TTL
    await anyio.sleep(0.5)
    res = await buf.resolve_and_replay(S, first)  # 1.0 s after open, 0.5 s after the append
    check_resumed(res, [(second, "a", 2, b"2")], "a")


# -- append_many ----------------------------------------------------------------


async def test_append_many_returns_consecutive_ids(make_buffer):
    buf = await make_buffer()
    info = await buf.open_session(S)
    one = await buf.append(S, "a", b"0")
    ids = await buf.append_many(S, "b", [b"1", None, b"3"])
    more = await buf.append_many(S, "a", (bytes([i]) for i in range(4)))
    assert [pos(i) for i in [one, *ids, *more]] == list(range(1, 9))
    assert {epoch_of(i) for i in [one, *ids, *more]} == {info.epoch}
    assert await buf.append_many(S, "a", []) == []
    assert (await buf.session_info(S)).high_water == 8


async def test_append_many_over_max_events_is_atomic_and_consistent(make_buffer):
    buf = await make_buffer(max_events=5)
    await buf.open_session(S)
    early = await buf.append(S, "x", b"x")
    ids = await buf.append_many(S, "a", [f"e{i}".encode() for i in range(8)])
    assert [pos(i) for i in ids] == list(range(2, 10))
    info = await buf.session_info(S)
    assert (info.floor, info.high_water, info.retained) == (5, 9, 5)
    assert info.sequences == {"x": SequenceInfo(2, 1, 0), "a": SequenceInfo(5, 9, 5)}
    check_resumed(await buf.resolve(S, early), [], "x")  # nothing of x after it is gone
    check_failed(await buf.resolve(S, ids[1]), Verdict.BELOW_FLOOR, torn_down=False)
    check_resumed(await buf.resolve(S, ids[2]), [], "a")  # a's newest evicted event
    res = await buf.resolve_and_replay(S, ids[3])
    check_resumed(res, [(ids[i], "a", i + 2, f"e{i}".encode()) for i in range(4, 8)], "a")
    # a batch far over the limit keeps only its own tail
    big = await buf.append_many(S, "b", [b"%d" % i for i in range(50)])
    info = await buf.session_info(S)
    assert (info.floor, info.high_water, info.retained) == (55, 59, 5)
    assert info.sequences == {
        "x": SequenceInfo(2, 1, 0),
        "a": SequenceInfo(10, 9, 0),
        "b": SequenceInfo(55, 59, 5),
    }
    res = await buf.resolve_and_replay(S, big[-5])
    check_resumed(res, [(big[i], "b", pos(big[i]), b"%d" % i) for i in range(46, 50)], "b")


async def test_every_reason_is_a_sentence(make_buffer, case):
    """The human text of every verdict's reason, including the rarer ones."""
    buf = await make_buffer(teardown_on_failure=False)
    info = await buf.open_session(S)
    origin = str(info.origin)
    seen = [await buf.resolve(S, origin)]  # resumed, nothing issued yet
    ids = await buf.append_many(S, "a", [b"1", b"2", b"3"])
    seen.append(await buf.resolve(S, ids[0]))
    seen.append(await buf.resolve(S, "junk"))
    seen.append(await buf.resolve(S, ids[0], "nope"))
    await case.damage(buf, S, 2)
    seen.append(await buf.resolve(S, ids[1]))  # the cursor's own event is missing
    seen.append(await buf.resolve(S, ids[0]))  # the chain is broken
    small = await make_buffer(max_events=1)
    small_info = await small.open_session("t")
    await small.append_many("t", "a", [b"1", b"2"])
    seen.append(await small.resolve("t", str(small_info.origin)))  # origin evicted
    seen.append(await small.resolve("t", "nope"))
    assert [r.verdict.value for r in seen] == [
        "resumed",
        "resumed",
        "malformed_cursor",
        "unknown_sequence",
        "not_retained",
        "not_retained",
        "below_floor",
        "malformed_cursor",
    ]
    for res in seen:
        check_reason(res)


# -- emptied sequences and the newest evicted event -----------------------------


async def test_the_newest_evicted_event_survives_compaction(make_buffer):
    """Evicted events leave their lists in batches (a sweep, an in-place trim); the
    newest evicted one of each sequence stays, because it proves a cursor at it."""
    buf = await make_buffer(max_events=20)
    await buf.open_session(S)
    a = await buf.append_many(S, "a", [b"a%d" % i for i in range(30)])  # a0..a9 evicted
    # 16 evictions of another sequence's events: on Redis, the sweep of a's list
    for i in range(16):
        await buf.append(S, "b", b"b%d" % i)  # evicts a10..a25, one by one
    check_resumed(
        await buf.resolve_and_replay(S, a[25]),
        [(a[i], "a", i + 1, b"a%d" % i) for i in range(26, 30)],
        "a",
    )
    check_failed(await buf.resolve(S, a[24]), Verdict.BELOW_FLOOR, torn_down=False)
    # the appending sequence's own list, trimmed in place after 64 evictions of its own
    many = [await buf.append(S, "c", b"c%d" % i) for i in range(85)]  # c0..c64 evicted
    check_resumed(
        await buf.resolve_and_replay(S, many[64]),
        [(many[i], "c", 47 + i, b"c%d" % i) for i in range(65, 85)],
        "c",
    )
    check_failed(await buf.resolve(S, many[63]), Verdict.BELOW_FLOOR, torn_down=False)


async def test_emptied_sequences_are_remembered_up_to_a_bound(make_buffer):
    """Every request of an MCP session is a sequence: the emptied ones are kept up
    to EVICTED_SEQUENCES (the newest), and a resume from a forgotten one fails closed."""
    buf = await make_buffer(max_events=1)
    await buf.open_session(S)
    count = EVICTED_SEQUENCES + 2
    ids = []
    for start in range(0, count, 100):  # one event per sequence, each evicting the one before
        for i in range(start, min(start + 100, count)):
            ids.append(await buf.append(S, f"r{i}", b"x"))
    info = await buf.session_info(S)
    assert info.retained == 1
    assert len(info.sequences) == EVICTED_SEQUENCES + 1  # the bound, and the retained one
    assert "r0" not in info.sequences and info.sequences["r1"] == SequenceInfo(3, 2, 0)
    check_failed(await buf.resolve(S, ids[0]), Verdict.BELOW_FLOOR, torn_down=False)
    check_failed(await buf.resolve(S, ids[0], "r0"), Verdict.UNKNOWN_SEQUENCE, torn_down=False)
    check_resumed(await buf.resolve(S, ids[1], "r1"), [], "r1")
    # a forgotten sequence named again starts afresh
    again = await buf.append(S, "r0", b"y")
    assert Cursor.parse(again).ordinal == 0
    check_resumed(await buf.resolve_and_replay(S, ids[-2]), [], f"r{count - 2}")

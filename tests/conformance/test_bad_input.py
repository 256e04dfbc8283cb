"""Hostile input: any cursor gives a verdict, any bad name or payload stores nothing.

How the fuzzing is split (hypothesis cannot drive an anyio test directly:
``@given`` does not wrap an ``async def`` run by the anyio plugin):

* Every backend case runs a fixed, hand-written list of ~50 hostile cursors
  (``HOSTILE``), parametrized, through the ``make_buffer`` fixture. That list
  holds the classes that matter (empty, 1 MB, unicode, CR/LF/NUL, signs,
  2**64, bare integers such as a bare ``4471``, leading zeros, padding,
  another epoch, non-strings) and keeps a real-server run short.
* The memory backend additionally gets hypothesis-generated input: a *sync*
  ``@given`` test that runs its async body with ``anyio.run(...)`` (there is no
  running event loop in a sync test) on its own ``memory://`` buffer, under
  asyncio and trio. The expected verdict of each drawn cursor is computed from
  the rules, not just "no exception".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore import (
    Cursor,
    InvalidInputError,
    ReplayBuffer,
    Resumption,
    UnknownSessionError,
    Verdict,
)
from replaystore.cursor import MAX_CURSOR_LENGTH
from replaystore.retention import MAX_BATCH, MAX_NAME_BYTES

from ._support import bare, check_failed, check_reason, check_resumed, pos

S = "sess-bad"
HW = 3  # session S holds a1, a2, a3 at positions 1, 2, 3

M = Verdict.MALFORMED_CURSOR


def _other(epoch: str) -> str:
    """A well-formed epoch that is not ``epoch``."""
    return "0123456789ab" if epoch != "0123456789ab" else "ba9876543210"


def _upper(epoch: str) -> tuple[str, Verdict]:
    """The epoch spelled in capitals: malformed, unless it has no letter at all."""
    return (f"{epoch.upper()}-1", M if epoch.upper() != epoch else Verdict.RESUMED)


# (label, cursor built from the session's epoch, expected verdict)
HOSTILE: list[tuple[str, Callable[[str], Any], Verdict | None]] = [
    ("empty", lambda e: "", M),
    ("bare-4471", lambda e: "4471", M),
    ("bare-1", lambda e: "1", M),
    ("bare-0", lambda e: "0", M),
    ("negative", lambda e: "-1", M),
    ("two-to-64", lambda e: str(2**64), M),
    ("epoch-only", lambda e: e, M),
    ("epoch-dash", lambda e: f"{e}-", M),
    ("dash-position", lambda e: "-1", M),
    ("leading-zero", lambda e: f"{e}-01", M),
    ("double-zero", lambda e: f"{e}-00", M),
    ("negative-position", lambda e: f"{e}--1", M),
    ("plus-position", lambda e: f"{e}-+1", M),
    ("space-before", lambda e: f" {e}-1", M),
    ("space-after", lambda e: f"{e}-1 ", M),
    ("tab-after", lambda e: f"{e}-1\t", M),
    ("crlf", lambda e: f"{e}-1\r\n", M),
    ("lf", lambda e: f"{e}-1\n", M),
    ("cr-inside", lambda e: f"{e}\r-1", M),
    ("nul-after", lambda e: f"{e}-1\x00", M),
    ("nul-inside", lambda e: f"{e}\x00-1", M),
    ("position-2-64", lambda e: f"{e}-{2**64}", M),
    ("position-over-max", lambda e: f"{e}-{10**14}", M),
    ("position-max", lambda e: f"{e}-{10**14 - 1}", Verdict.AHEAD_OF_HIGH_WATER),
    ("position-ahead", lambda e: f"{e}-{HW + 1}", Verdict.AHEAD_OF_HIGH_WATER),
    ("position-float", lambda e: f"{e}-1.0", M),
    ("position-exp", lambda e: f"{e}-1e1", M),
    ("position-hex", lambda e: f"{e}-0x1", M),
    ("position-arabic-indic", lambda e: f"{e}-\u0661", M),
    ("position-fullwidth", lambda e: f"{e}-\uff11", M),
    ("epoch-non-hex", lambda e: f"{e[:-1]}g-1", M),
    ("epoch-short", lambda e: f"{e[:-1]}-1", M),
    ("epoch-long", lambda e: f"{e}0-1", M),
    ("underscore", lambda e: f"{e}_1", M),
    ("colon", lambda e: f"{e}:1", M),
    ("one-megabyte", lambda e: "x" * (1 << 20), M),
    ("one-megabyte-tail", lambda e: f"{e}-1" + "0" * (1 << 20), M),
    ("lone-surrogate", lambda e: "\ud800", M),
    ("emoji", lambda e: "\U0001f600-1", M),
    ("json-null", lambda e: "null", M),
    ("other-epoch", lambda e: f"{_other(e)}-1", Verdict.FOREIGN_CURSOR),
    ("other-epoch-origin", lambda e: f"{_other(e)}-0", Verdict.FOREIGN_CURSOR),
    ("other-epoch-ahead", lambda e: f"{_other(e)}-99", Verdict.FOREIGN_CURSOR),
    ("none", lambda e: None, M),
    ("int-4471", lambda e: 4471, M),
    ("float", lambda e: 1.5, M),
    ("bytes-not-ascii", lambda e: b"\xff\xfe-1", M),
    ("bytes-junk", lambda e: b"4471", M),
    ("list", lambda e: [e, 1], M),
    ("uppercase-epoch", lambda e: _upper(e)[0], None),  # expected computed below
    ("control-valid", lambda e: f"{e}-1", Verdict.RESUMED),
    ("control-origin", lambda e: f"{e}-0", Verdict.RESUMED),
]


async def _session(buf: ReplayBuffer) -> str:
    info = await buf.open_session(S)
    await buf.append_many(S, "a", [b"a1", b"a2", b"a3"])
    return info.epoch


@pytest.mark.anyio
@pytest.mark.parametrize(("label", "build", "expected"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_cursor_always_gets_a_verdict(make_buffer, label, build, expected):
    buf = await make_buffer()
    epoch = await _session(buf)
    cursor = build(epoch)
    if expected is None:
        expected = _upper(epoch)[1]

    probe = await buf.resolve(S, cursor)
    assert isinstance(probe, Resumption)
    assert probe.verdict is expected, probe
    assert isinstance(probe.evidence.cursor, str)
    assert len(probe.evidence.cursor) <= MAX_CURSOR_LENGTH
    assert probe.evidence.torn_down is False
    assert probe.events == []

    res = await buf.resolve_and_replay(S, cursor)
    assert res.verdict is expected, res
    if expected is Verdict.RESUMED:
        position = Cursor.parse(cursor).position
        want = [(f"{epoch}-{p}", "a", p, b"a%d" % p) for p in range(position + 1, HW + 1)]
        check_resumed(res, want, "a")
        assert await buf.session_info(S) is not None
    else:
        check_failed(res, expected, torn_down=True)
        if expected is M:
            assert res.evidence.cursor_epoch is None
            assert res.evidence.cursor_position is None
        assert await buf.session_info(S) is None  # fail closed
    # a hostile cursor on an unknown session is still just a verdict
    other = await buf.resolve_and_replay("no-such-session", cursor)
    check_failed(other, Verdict.UNKNOWN_SESSION, torn_down=False)


# -- names and payloads ---------------------------------------------------------

BAD_SESSIONS = [
    "",
    " ",
    "a b",
    "tab\t",
    "line\n",
    "nul\x00",
    "del\x7f",
    "caf\u00e9",
    "\U0001f600",
    "x" * (MAX_NAME_BYTES + 1),
    None,
    7,
    b"bytes",
    ["list"],
]

BAD_SEQUENCES = [
    "",
    "\x00",
    "a\x00b",
    "x" * (MAX_NAME_BYTES + 1),
    "\u00e9" * (MAX_NAME_BYTES // 2 + 1),  # 258 UTF-8 bytes in 129 characters
    "\ud800",
    None,
    5,
    b"seq",
]


@pytest.mark.anyio
@pytest.mark.parametrize("session", BAD_SESSIONS, ids=lambda v: repr(v)[:24])
async def test_bad_session_id_raises_and_stores_nothing(make_buffer, session):
    buf = await make_buffer()
    await buf.open_session(S)
    await buf.append(S, "a", b"1")
    with pytest.raises(InvalidInputError):
        await buf.open_session(session)
    with pytest.raises(InvalidInputError):
        await buf.append(session, "a", b"x")
    with pytest.raises(InvalidInputError):
        await buf.append_many(session, "a", [b"x", None])
    with pytest.raises(InvalidInputError):
        await buf.close_session(session)
    assert await buf.session_info(session) is None
    res = await buf.resolve_and_replay(session, "0123456789ab-1")
    check_failed(res, Verdict.UNKNOWN_SESSION, torn_down=False)
    info = await buf.session_info(S)
    assert (info.high_water, info.retained) == (1, 1)


@pytest.mark.anyio
@pytest.mark.parametrize("sequence", BAD_SEQUENCES, ids=lambda v: repr(v)[:24])
async def test_bad_sequence_name_raises_and_stores_nothing(make_buffer, sequence):
    buf = await make_buffer()
    await buf.open_session(S)
    first = await buf.append(S, "a", b"1")
    with pytest.raises(InvalidInputError):
        await buf.append(S, sequence, b"x")
    with pytest.raises(InvalidInputError):
        await buf.append_many(S, sequence, [b"x", None])
    info = await buf.session_info(S)
    assert (info.high_water, info.retained, list(info.sequences)) == (1, 1, ["a"])
    # nothing was stored: the next position is still 2
    assert bare(await buf.append(S, "a", b"2")).endswith("-2")
    res = await buf.resolve_and_replay(S, first)
    assert [e.payload for e in res.events] == [b"2"]


@pytest.mark.parametrize(
    ("payloads", "label"),
    [
        (["text"], "str"),
        ([bytearray(b"x")], "bytearray"),
        ([memoryview(b"x")], "memoryview"),
        ([1], "int"),
        ([b"x" * 17], "over-max-payload"),
        ([b"ok", b"ok", b"x" * 17], "last-over-max-payload"),
        ([b"ok", None, "late-str"], "last-wrong-type"),
        ([b"x"] * (MAX_BATCH + 1), "batch-over-limit"),
        ([None] * (MAX_BATCH + 1), "priming-batch-over-limit"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
@pytest.mark.anyio
async def test_bad_payloads_raise_and_store_nothing(make_buffer, payloads, label):
    buf = await make_buffer(max_payload=16)
    await buf.open_session(S)
    await buf.append(S, "a", b"1")
    with pytest.raises(InvalidInputError):
        await buf.append_many(S, "a", payloads)
    if len(payloads) == 1:
        with pytest.raises(InvalidInputError):
            await buf.append(S, "a", payloads[0])
    # a str or bytes object passed as the batch itself is not a list of payloads
    with pytest.raises(InvalidInputError):
        await buf.append_many(S, "a", "abc")  # type: ignore[arg-type]
    info = await buf.session_info(S)
    assert (info.high_water, info.retained) == (1, 1)


@pytest.mark.anyio
async def test_limits_are_inclusive(make_buffer):
    buf = await make_buffer(max_payload=16, max_events=MAX_BATCH + 10)
    edge_session = "s" * MAX_NAME_BYTES
    await buf.open_session(edge_session)
    long_ascii = "q" * MAX_NAME_BYTES
    long_utf8 = "\u00e9" * (MAX_NAME_BYTES // 2)  # exactly 256 UTF-8 bytes
    ids = [
        await buf.append(edge_session, long_ascii, b"x" * 16),
        await buf.append(edge_session, long_utf8, b""),
        await buf.append(edge_session, long_utf8, None),
    ]
    big = await buf.append_many(edge_session, long_ascii, [b""] * MAX_BATCH)
    assert len(big) == MAX_BATCH
    info = await buf.session_info(edge_session)
    assert info.high_water == 3 + MAX_BATCH
    assert set(info.sequences) == {long_ascii, long_utf8}
    res = await buf.resolve_and_replay(edge_session, ids[1])
    check_resumed(res, [(ids[2], long_utf8, 3, None)], long_utf8)


ODD_BUT_VALID_SESSIONS = ["}", "{", "{}", "}x", "a{b}c", "{x}", "a:b:e", "~!@#$%^&*()", "1"]
ODD_BUT_VALID_SEQUENCES = [" ", "\n", "h:x", "{tag}", "}", "\U0001f600", "a" * 254 + "\u00e9"]


@pytest.mark.anyio
@pytest.mark.parametrize("session", ODD_BUT_VALID_SESSIONS)
async def test_odd_but_valid_session_ids_work(make_buffer, session):
    """Visible-ASCII session ids are valid, braces (Redis hash tags) included."""
    buf = await make_buffer()
    two = await make_buffer()
    info = await buf.open_session(session)
    ids = await buf.append_many(session, "a", [b"1", b"2"])
    assert (await two.session_info(session)).epoch == info.epoch
    check_resumed(await two.resolve_and_replay(session, ids[0]), [(ids[1], "a", 2, b"2")], "a")
    res = await two.resolve_and_replay(session, "junk")
    check_failed(res, Verdict.MALFORMED_CURSOR, torn_down=True)
    assert await buf.session_info(session) is None
    gone = await buf.resolve(session, ids[0])
    assert gone.evidence.tombstone is not None
    assert gone.evidence.tombstone.verdict is Verdict.MALFORMED_CURSOR
    assert await buf.close_session(session) is False
    await buf.open_session(session)
    assert await two.close_session(session) is True


@pytest.mark.anyio
async def test_odd_but_valid_sequence_names_round_trip(make_buffer):
    buf = await make_buffer()
    info = await buf.open_session(S)
    ids = {}
    for name in ODD_BUT_VALID_SEQUENCES:
        ids[name] = await buf.append_many(S, name, [name.encode("utf-8"), None])
    snap = await buf.session_info(S)
    assert set(snap.sequences) == set(ODD_BUT_VALID_SEQUENCES)
    for name, (first, second) in ids.items():
        res = await buf.resolve_and_replay(S, first, name)
        check_resumed(res, [(second, name, pos(second), None)], name)
        res = await buf.resolve_and_replay(S, str(info.origin), name)
        assert [e.payload for e in res.events] == [name.encode("utf-8"), None]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "hint", ["", "\x00", "a\x00", "\ud800", 0, b"a", ["a"], "x" * 300], ids=lambda v: repr(v)[:24]
)
async def test_invalid_sequence_hint_is_a_verdict(make_buffer, hint):
    buf = await make_buffer()
    await _session(buf)
    probe = await buf.resolve(S, f"{(await buf.session_info(S)).epoch}-1", hint)
    check_failed(probe, Verdict.UNKNOWN_SEQUENCE, torn_down=False)
    res = await buf.resolve_and_replay(S, "junk", hint)  # malformed is checked first
    check_failed(res, Verdict.MALFORMED_CURSOR, torn_down=True)


# -- property tests, memory backend only (see the module docstring) ----------------


def _near_cursor() -> st.SearchStrategy[tuple[str, str, str, str]]:
    """(prefix, which epoch, separator+position text, suffix): mostly almost-cursors."""
    digits = st.text(alphabet="0123456789", min_size=0, max_size=18)
    junk = st.text(max_size=3)
    return st.tuples(
        st.one_of(st.just(""), junk),
        st.sampled_from(["own", "other", "upper", "short", "none"]),
        st.one_of(digits.map(lambda d: "-" + d), st.text(alphabet="-+ 0123456789\r\n", max_size=8)),
        st.one_of(st.just(""), junk),
    )


def _assemble(epoch: str, parts: tuple[str, str, str, str]) -> str:
    prefix, which, tail, suffix = parts
    head = {
        "own": epoch,
        "other": _other(epoch),
        "upper": epoch.upper(),
        "short": epoch[:-1],
        "none": "",
    }[which]
    return prefix + head + tail + suffix


def _expected(epoch: str, cursor: object) -> Verdict:
    parsed = Cursor.try_parse(cursor)
    if parsed is None:
        return Verdict.MALFORMED_CURSOR
    if parsed.epoch != epoch:
        return Verdict.FOREIGN_CURSOR
    if parsed.position > HW:
        return Verdict.AHEAD_OF_HIGH_WATER
    return Verdict.RESUMED


async def _judge_one(loop_cursor: Callable[[str], object]) -> None:
    async with ReplayBuffer.from_url("memory://") as buf:
        epoch = await _session(buf)
        cursor = loop_cursor(epoch)
        expected = _expected(epoch, cursor)
        probe = await buf.resolve(S, cursor)  # type: ignore[arg-type]
        assert probe.verdict is expected, (cursor, probe)
        check_reason(probe)
        res = await buf.resolve_and_replay(S, cursor)  # type: ignore[arg-type]
        assert res.verdict is expected, (cursor, res)
        if expected is Verdict.RESUMED:
            position = Cursor.parse(cursor).position
            assert [e.position for e in res.events] == list(range(position + 1, HW + 1))
        else:
            assert res.events == []
            assert res.evidence.torn_down
            assert await buf.session_info(S) is None
            with pytest.raises(UnknownSessionError):
                await buf.append(S, "a", b"x")


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@FUZZ
@given(parts=_near_cursor())
def test_fuzzed_near_cursors_memory(loop, parts):
    anyio.run(_judge_one, lambda epoch: _assemble(epoch, parts), backend=loop)


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@FUZZ
@given(
    value=st.one_of(
        st.text(),
        st.text(alphabet=st.characters(codec="ascii"), max_size=40),
        st.binary(max_size=40),
        st.integers(),
        st.none(),
        st.floats(allow_nan=True),
    )
)
def test_fuzzed_arbitrary_values_memory(loop, value):
    anyio.run(_judge_one, lambda epoch: value, backend=loop)


@FUZZ
@given(session=st.one_of(st.text(max_size=300), st.binary(max_size=10), st.integers()))
def test_fuzzed_session_ids_memory(session):
    """A session id is accepted exactly when it is 1..256 visible ASCII characters."""

    async def body() -> None:
        async with ReplayBuffer.from_url("memory://") as buf:
            valid = (
                isinstance(session, str)
                and 0 < len(session) <= MAX_NAME_BYTES
                and all(0x21 <= ord(c) <= 0x7E for c in session)
            )
            if valid:
                await buf.open_session(session)
                event_id = await buf.append(session, "a", b"x")
                assert (await buf.session_info(session)).high_water == 1
                assert (await buf.resolve_and_replay(session, event_id)).ok
            else:
                with pytest.raises(InvalidInputError):
                    await buf.open_session(session)
                assert await buf.session_info(session) is None
                res = await buf.resolve_and_replay(session, "0123456789ab-1")
                assert res.verdict is Verdict.UNKNOWN_SESSION

    anyio.run(body)


@FUZZ
@given(sequence=st.one_of(st.text(max_size=300), st.binary(max_size=10), st.none()))
def test_fuzzed_sequence_names_memory(sequence):
    """A sequence name is accepted exactly when it is 1..256 UTF-8 bytes without NUL."""

    async def body() -> None:
        async with ReplayBuffer.from_url("memory://") as buf:
            await buf.open_session(S)
            try:
                size = len(sequence.encode("utf-8")) if isinstance(sequence, str) else -1
            except UnicodeEncodeError:
                size = -1
            valid = 0 < size <= MAX_NAME_BYTES and "\x00" not in sequence
            if valid:
                first = await buf.append(S, sequence, None)
                second = await buf.append(S, sequence, b"2")
                res = await buf.resolve_and_replay(S, first, sequence)
                assert [(e.event_id, e.sequence) for e in res.events] == [(second, sequence)]
            else:
                with pytest.raises(InvalidInputError):
                    await buf.append(S, sequence, b"x")
                assert (await buf.session_info(S)).high_water == 0

    anyio.run(body)

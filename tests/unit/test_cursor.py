"""The cursor codec: one spelling per cursor, everything else is a CursorError."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore import Cursor, CursorError
from replaystore.cursor import (
    EPOCH_LENGTH,
    MAX_CURSOR_LENGTH,
    MAX_POSITION,
    TAG_LENGTH,
    event_id,
    event_id_format,
    new_epoch,
    sequence_tag,
)

HEX = "0123456789abcdef"
epochs = st.text(alphabet=HEX, min_size=EPOCH_LENGTH, max_size=EPOCH_LENGTH)
positions = st.integers(min_value=0, max_value=MAX_POSITION)
cursors = st.builds(Cursor, epochs, positions)
CANONICAL = re.compile(r"[0-9a-f]{12}-(0|[1-9][0-9]{0,13})")
#: The whole grammar of a cursor, hint included, as one pattern: the parser is held to it.
_NUMBER = "(0|[1-9][0-9]{0,13})"
GRAMMAR = re.compile(rf"[0-9a-f]{{12}}-{_NUMBER}(?:\.[0-9a-f]{{16}}\.{_NUMBER}\.{_NUMBER})?")


@given(cursors)
def test_round_trip(cursor):
    text = str(cursor)
    assert text == f"{cursor.epoch}-{cursor.position}"
    assert Cursor.parse(text) == cursor
    assert Cursor.try_parse(text) == cursor
    assert Cursor.parse(text.encode("ascii")) == cursor  # bytes, as read off the wire
    assert len(text) <= MAX_CURSOR_LENGTH
    assert CANONICAL.fullmatch(text)


@given(cursors)
def test_ids_are_valid_sse_id_fields(cursor):
    text = str(cursor)
    assert not set(text) & {"\r", "\n", "\x00"}
    assert text.isascii()
    assert text.strip() == text


@settings(max_examples=500)
@given(st.text())
def test_arbitrary_text_is_rejected_or_spelled_exactly(text):
    try:
        cursor = Cursor.parse(text)
    except CursorError:
        assert Cursor.try_parse(text) is None
        return
    assert str(cursor) == text  # never accepts a second spelling of a cursor


@settings(max_examples=500)
@given(
    st.one_of(
        st.text(alphabet=HEX + "-+ 0\r\n\x00ABCDEFG", max_size=MAX_CURSOR_LENGTH + 3),
        st.builds(
            lambda e, sep, p, tail: f"{e}{sep}{p}{tail}",
            st.text(alphabet=HEX + "ABCDEF", min_size=11, max_size=13),
            st.sampled_from(["-", "--", "_", ":", " - ", ""]),
            st.one_of(
                st.integers(-5, 10**20).map(str), st.text(alphabet="0123456789", max_size=20)
            ),
            st.sampled_from(["", " ", "\n", "\r\n", "\x00", "0"]),
        ),
    )
)
def test_near_cursors_are_rejected_or_spelled_exactly(text):
    cursor = Cursor.try_parse(text)
    if cursor is not None:
        assert str(cursor) == text
        assert CANONICAL.fullmatch(text)
    else:
        assert not CANONICAL.fullmatch(text)
        with pytest.raises(CursorError):
            Cursor.parse(text)


@settings(max_examples=300)
@given(st.binary(max_size=40))
def test_arbitrary_bytes_are_rejected_or_spelled_exactly(data):
    try:
        cursor = Cursor.parse(data)
    except CursorError:
        return
    assert str(cursor).encode("ascii") == data


@given(st.one_of(st.integers(), st.floats(), st.none(), st.lists(st.integers()), st.tuples()))
def test_non_text_is_a_cursor_error(value):
    with pytest.raises(CursorError):
        Cursor.parse(value)
    assert Cursor.try_parse(value) is None


def test_cursor_error_is_a_value_error():
    assert issubclass(CursorError, ValueError)


E = "0123456789ab"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "4471",
        "0",
        "-1",
        E,
        f"{E}-",
        f"{E}--1",
        f"{E}-+1",
        f"{E}-01",
        f"{E}-00",
        f" {E}-1",
        f"{E}-1 ",
        f"{E}-1\n",
        f"{E}-1\r\n",
        f"{E}-1\x00",
        f"{E.upper()}-1",
        "0123456789AB-1",
        f"{E[:-1]}-1",
        f"{E}0-1",
        f"{E}-1.0",
        f"{E}-1e3",
        f"{E}-0x1",
        f"{E}-\u0661",  # ARABIC-INDIC DIGIT ONE: str.isdigit() but not a cursor digit
        f"{E}-\uff11",  # FULLWIDTH DIGIT ONE
        f"{E}-{MAX_POSITION + 1}",
        f"{E}-{2**64}",
        f"{E}-1" + "0" * (1 << 20),
        "x" * (1 << 20),
        "\ud800",
    ],
)
def test_rejects(text):
    with pytest.raises(CursorError):
        Cursor.parse(text)
    assert Cursor.try_parse(text) is None


def test_max_lengths():
    longest = Cursor("f" * EPOCH_LENGTH, MAX_POSITION, "f" * TAG_LENGTH, MAX_POSITION, MAX_POSITION)
    assert len(str(longest)) == MAX_CURSOR_LENGTH
    assert Cursor.parse(str(longest)) == longest
    longest = Cursor("f" * EPOCH_LENGTH, MAX_POSITION)
    assert Cursor.parse(str(longest)) == longest
    assert MAX_POSITION == 10**14 - 1
    with pytest.raises(CursorError):
        Cursor.parse(f"{E}-{MAX_POSITION + 1}")  # one character too long
    with pytest.raises(CursorError):
        Cursor.parse(str(longest) + "0")
    with pytest.raises(CursorError):
        Cursor.parse(f"{E}-1.{'f' * TAG_LENGTH}.{MAX_POSITION + 1}.1")
    assert Cursor.parse(f"{E}-0") == Cursor(E, 0)  # the origin


def test_bytes_input():
    assert Cursor.parse(f"{E}-7".encode()) == Cursor(E, 7)
    for bad in (b"", b"\xff", f"{E}-7\n".encode(), "\u00e9".encode(), f"{E}-07".encode()):
        with pytest.raises(CursorError):
            Cursor.parse(bad)
    with pytest.raises(CursorError):
        Cursor.parse(bytearray(f"{E}-7".encode()))


@pytest.mark.parametrize(
    ("epoch", "position"),
    [
        ("0123456789AB", 1),
        ("0123456789a", 1),
        ("0123456789abc", 1),
        ("0123456789ag", 1),
        (12, 1),
        (E, -1),
        (E, MAX_POSITION + 1),
        (E, True),
        (E, 1.0),
        (E, "1"),
    ],
)
def test_constructor_validates(epoch, position):
    with pytest.raises(CursorError):
        Cursor(epoch, position)


def test_new_epoch_is_a_fresh_valid_epoch():
    epochs_seen = {new_epoch() for _ in range(200)}
    assert len(epochs_seen) == 200
    for epoch in epochs_seen:
        assert re.fullmatch(r"[0-9a-f]{12}", epoch)
        assert Cursor.parse(f"{epoch}-0").epoch == epoch


@given(cursors, cursors)
def test_order_and_equality_follow_the_fields(a, b):
    assert (a == b) == ((a.epoch, a.position) == (b.epoch, b.position))
    assert (a < b) == ((a.epoch, a.position) < (b.epoch, b.position))
    assert (hash(a) == hash(b)) or a != b


TAGS = st.text(alphabet=HEX, min_size=TAG_LENGTH, max_size=TAG_LENGTH)
hinted = st.builds(
    Cursor, epochs, st.integers(min_value=1, max_value=MAX_POSITION), TAGS, positions, positions
)


@given(hinted)
def test_hinted_round_trip(cursor):
    text = str(cursor)
    assert text == (
        f"{cursor.epoch}-{cursor.position}.{cursor.tag}.{cursor.ordinal}.{cursor.stamp}"
    )
    assert Cursor.parse(text) == cursor
    assert Cursor.parse(text).bare == Cursor(cursor.epoch, cursor.position)
    assert Cursor.parse(text).position == cursor.position  # what the MCP layer compares
    assert len(text) <= MAX_CURSOR_LENGTH
    assert not set(text) & {"\r", "\n", "\x00"}


@pytest.mark.parametrize(
    "text",
    [
        f"{E}-0.{'a' * TAG_LENGTH}.0.5",  # the origin carries no hint
        f"{E}-1.{'a' * TAG_LENGTH}",  # part of a hint
        f"{E}-1.{'a' * TAG_LENGTH}.0",
        f"{E}-1.{'a' * TAG_LENGTH}.0.01",
        f"{E}-1.{'a' * TAG_LENGTH}.",
        f"{E}-1.{'a' * (TAG_LENGTH - 1)}.0",
        f"{E}-1.{'A' * TAG_LENGTH}.0",
        f"{E}-1.{'a' * TAG_LENGTH}.01",
        f"{E}-1..0",
        f"{E}-1.{'a' * TAG_LENGTH}.0.",
        f"{E}-1.{'a' * TAG_LENGTH}.-1",
    ],
)
def test_bad_hints_are_rejected(text):
    assert Cursor.try_parse(text) is None


def test_sequence_tags_are_fixed_length_hex():
    for name in ("_GET_stream", "1", "\U0001f600", "x" * 256):
        tag = sequence_tag(name)
        assert re.fullmatch(r"[0-9a-f]{16}", tag)
    assert sequence_tag("a") != sequence_tag("b")


_numbers = st.integers(min_value=0, max_value=MAX_POSITION)


@given(st.integers(min_value=1, max_value=MAX_POSITION), _numbers, _numbers, st.booleans())
def test_event_ids_parse_back_to_what_they_were_spelled_from(position, ordinal, stamp, as_text):
    """Both spellings (the function, the format of the replay loop) give the one parsed id."""
    epoch, tag = new_epoch(), sequence_tag(str(ordinal))
    text = event_id(epoch, position, tag, str(ordinal) if as_text else ordinal, stamp)
    assert text == event_id_format(epoch, tag) % (
        position,
        ordinal,
        str(stamp) if as_text else stamp,
    )
    assert Cursor.parse(text) == Cursor(epoch, position, tag, ordinal, stamp)
    assert str(Cursor.parse(text)) == text


def test_event_id_format_leaves_only_the_numbers_to_fill():
    assert event_id_format("0123456789ab", "9c1f0e2a7b3d4c5e") % (4471, 1088, "1764694800123") == (
        "0123456789ab-4471.9c1f0e2a7b3d4c5e.1088.1764694800123"
    )


def test_the_malformed_reason_spells_the_form_real_ids_have() -> None:
    """The text a client reads in a 404 names every part of an issued id, the stamp too."""
    from replaystore.verdicts import reason_text

    with pytest.raises(CursorError) as caught:
        Cursor.parse("4471")
    form = str(caught.value).rsplit(" ", 1)[-1]
    assert form == "<epoch>-<position>[.<tag>.<ordinal>.<stamp>]"
    assert reason_text("malformed").endswith(form)
    issued = str(Cursor("3f9a1c0b7d2e", 4471, "9c1f0e2a7b3d4c5e", 1088, 1764694800123))
    assert issued.count(".") == form.count(".")


@given(hinted)
def test_a_parsed_cursor_is_the_constructed_one(cursor):
    """Parsing builds the cursor without its constructor: equal, same hash, just as frozen."""
    import dataclasses

    parsed = Cursor.parse(str(cursor))
    assert type(parsed) is Cursor
    assert parsed == cursor and hash(parsed) == hash(cursor)
    assert dataclasses.astuple(parsed) == dataclasses.astuple(cursor)
    assert parsed.bare == Cursor(cursor.epoch, cursor.position) and parsed.bare.tag is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.position = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (f"{E}-0.{'a' * TAG_LENGTH}.0.5", "the origin carries no hint"),
        (b"\xff", "not ASCII"),
        (7, "must be a string, not int"),
        ("x" * (MAX_CURSOR_LENGTH + 1), "longer than"),
        (f"{E}-01", "not of the form"),
    ],
)
def test_each_refusal_says_why(value, message):
    with pytest.raises(CursorError, match=message):
        Cursor.parse(value)
    assert Cursor.try_parse(value) is None


def test_text_and_cursor_subclasses():
    class Text(str):
        pass

    class Mine(Cursor):
        pass

    assert Cursor.parse(Text(f"{E}-7.{'a' * TAG_LENGTH}.1.2")) == Cursor(
        E, 7, "a" * TAG_LENGTH, 1, 2
    )
    mine = Mine.parse(f"{E}-7")
    assert type(mine) is Mine and mine == Mine(E, 7)
    assert Mine.try_parse(f"{E}-07") is None
    with pytest.raises(CursorError):
        Mine.parse(f"{E}-0.{'a' * TAG_LENGTH}.0.5")


_PIECES = st.sampled_from(
    [
        "",
        "0",
        "1",
        "07",
        "12",
        "9" * 14,
        "9" * 15,
        "a",
        "f",
        "g",
        "A",
        ".",
        "-",
        "+",
        " ",
        "\n",
        "\x00",
        "\u0663",
        "\u00b2",
        "\uff11",
        "ab" * 6,
        "0123456789ab",
        "c" * 16,
        "c" * 15,
        "0123456789aA",
        "c" * 15 + "C",
        "c" * 15 + "g",
        "0123456789a\u0663",
        "1\u0663",
        "\u00b2" * 3,
    ]
)


@settings(max_examples=1500)
@given(
    st.one_of(
        st.lists(_PIECES, max_size=12).map("".join),
        st.builds(
            lambda epoch, position, tag, ordinal, stamp, seps: (
                f"{epoch}{seps[0]}{position}{seps[1]}{tag}{seps[2]}{ordinal}{seps[3]}{stamp}"
            ),
            st.one_of(st.just("0123456789ab"), _PIECES),
            st.one_of(st.integers(0, 10**15).map(str), _PIECES),
            st.one_of(st.just("0123456789abcdef"), _PIECES),
            st.one_of(st.integers(0, 10**15).map(str), _PIECES),
            st.one_of(st.integers(0, 10**15).map(str), _PIECES),
            st.tuples(
                st.sampled_from(["-", "-", "-", ".", ""]),
                *[st.sampled_from([".", ".", ".", "", "..", ":"])] * 3,
            ),
        ),
        st.builds(
            lambda epoch, position: f"{epoch}-{position}",
            st.one_of(st.just("0123456789ab"), _PIECES),
            st.one_of(st.integers(0, 10**15).map(str), _PIECES),
        ),
    )
)
def test_the_parser_accepts_exactly_the_grammar(text):
    """Every text the grammar's pattern matches parses (bar a hint on the origin), and no other."""
    cursor = Cursor.try_parse(text)
    matched = GRAMMAR.fullmatch(text) is not None
    origin_with_hint = matched and text.split("-", 1)[1].split(".")[0] == "0" and "." in text
    assert (cursor is not None) == (matched and not origin_with_hint), text
    if cursor is not None:
        assert str(cursor) == text

"""How the Redis backend decodes a sequence's list elements, and builds events from them.

The decoder has a fast path (whole lists of well-formed elements, decoded with
``map`` over C functions) and a slow one (anything else); both must read every
element exactly as the element format says, whatever Redis hands back.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replaystore.backends.redis.replies import decode_elements
from replaystore.cursor import Cursor, sequence_tag
from replaystore.rules import Chain


def _reference(element: bytes) -> tuple[int | None, bytes | None, str | None]:
    """One element, read the plain way: ``<position>,<stamp>[:<payload>]``, else a hole.

    Numbers as the scripts write them: ASCII digits, no sign, no leading zero.
    """
    head, colon, payload = element.partition(b":")
    position, comma, stamp = head.partition(b",")
    numbers = (position, stamp)
    if not comma or not all(n.isdigit() and (n == b"0" or n[:1] != b"0") for n in numbers):
        return None, payload if colon else None, None
    return int(position), payload if colon else None, stamp.decode()


_numbers = st.integers(min_value=0, max_value=10**14 - 1).map(lambda n: b"%d" % n)
_positions = st.integers(min_value=1, max_value=10**14 - 1).map(lambda n: b"%d" % n)
_payloads = st.binary(max_size=40)
_data = st.builds(lambda p, s, d: p + b"," + s + b":" + d, _numbers, _numbers, _payloads)
_priming = st.builds(lambda p, s: p + b"," + s, _numbers, _numbers)
_damaged = st.one_of(
    st.just(b""),  # a lost event's place
    st.binary(max_size=30),  # anything at all
    st.builds(lambda p, s, d: p + b",+" + s + b":" + d, _numbers, _numbers, _payloads),
    st.builds(lambda p, s: b" " + p + b"," + s, _numbers, _numbers),
    st.builds(lambda p, s: p + b",," + s, _numbers, _numbers),
    st.builds(lambda p: p + b",\xd9\xa3", _numbers),  # a non-ASCII digit
    st.builds(lambda p, s: p + b",0" + s, _numbers, _numbers),  # a leading zero
    st.builds(lambda p, s: p + b";" + s + b",1", _numbers, _numbers),
    st.sampled_from([b"1,2,3:x", b"4:y", b"5", b"6,7,8", b"9;1,2"]),  # commas that pair up
)


@given(st.lists(st.one_of(_data, _priming), max_size=50))
def test_well_formed_lists_decode_exactly(elements: list[bytes]) -> None:
    stored = decode_elements(elements)
    expected = [_reference(e) for e in elements]
    assert stored.positions == [p for p, _, _ in expected]
    assert stored.payloads == [d for _, d, _ in expected]
    assert stored.stamps == [s for _, _, s in expected]


@given(st.lists(st.one_of(_data, _priming, _damaged), max_size=30))
def test_damaged_elements_read_as_holes_and_the_rest_exactly(elements: list[bytes]) -> None:
    stored = decode_elements(elements)
    expected = [_reference(e) for e in elements]
    assert stored.positions == [p for p, _, _ in expected]
    assert stored.payloads == [d for _, d, _ in expected]
    for (position, _, stamp), got in zip(expected, stored.stamps, strict=True):
        if position is not None:
            assert got == stamp


@given(
    st.lists(st.tuples(_positions, _numbers, _payloads), min_size=1, max_size=30),
    st.integers(min_value=0, max_value=10**6),
)
def test_event_ids_are_cursors_naming_each_event(
    rows: list[tuple[bytes, bytes, bytes]], first: int
) -> None:
    """The ids a replay hands out parse back to the event's own position, tag, ordinal
    and stamp, from text stamps (Redis) and from integer ones (memory) alike."""
    elements = [p + b"," + s + b":" + d for p, s, d in rows]
    stored = decode_elements(elements)
    positions = [p for p in stored.positions if p is not None]
    assert len(positions) == len(rows)
    epoch = "0123456789ab"
    assert stored.texts == [str(p) for p in positions]  # as read: canonical numbers
    spelled = Chain("s", first, positions, stored.payloads, stored.stamps).events(epoch)
    joined = Chain("s", first, positions, stored.payloads, stored.stamps, stored.texts)
    assert joined.events(epoch) == spelled  # joined from text as formatted from numbers
    for stamps, texts in (
        (stored.stamps, stored.texts),
        (stored.stamps, None),
        ([int(s) for s in stored.stamps], None),
    ):
        chain = Chain("seq, with a comma", first, positions, stored.payloads, stamps, texts)
        events = chain.events(epoch)
        assert [e.payload for e in events] == [d for _, _, d in rows]
        for i, event in enumerate(events):
            cursor = Cursor.parse(event.event_id)
            assert cursor.epoch == epoch
            assert cursor.position == event.position == int(rows[i][0])
            assert cursor.tag == sequence_tag("seq, with a comma")
            assert cursor.ordinal == first + i
            assert cursor.stamp == int(rows[i][1])
            assert event.sequence == "seq, with a comma"


@pytest.mark.parametrize("first", [0, 988, 995, 999, 1000, 1994, 12_000, 999_990, 10**6])
def test_event_ids_spell_each_ordinal_across_thousands(first: int) -> None:
    """Ordinals below a thousand, within one thousand above it, and across a thousand: each
    id names its own."""
    count = 12
    positions = list(range(5, 5 + count))
    texts, stamps = [str(p) for p in positions], [str(1000 + p) for p in positions]
    events = Chain("s", first, positions, [b"x"] * count, stamps, texts).events("0123456789ab")
    assert [Cursor.parse(e.event_id).ordinal for e in events] == list(range(first, first + count))
    assert events == Chain("s", first, positions, [b"x"] * count, stamps).events("0123456789ab")

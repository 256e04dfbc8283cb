"""The packets the Redis backend builds from pieces packed once are the commands, packed plainly.

The fast read and the teardown transaction are packed by hand from fixed
pieces (their session's keys are new on nearly every call in a storm); each
must be byte for byte what :func:`pack_one` makes of the same commands, for
any session name, sequence and condition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from replaystore.backends.redis import teardown
from replaystore.backends.redis.fastpath import FastPath
from replaystore.backends.redis.wire import pack_one
from replaystore.cursor import sequence_tag
from replaystore.retention import Retention

_names = st.text(min_size=1, max_size=12)


class _ByHand:
    by_hand = True


class _Canned:
    """Answers ``watched`` with the replies of a live session of two sequences."""

    def __init__(self, epoch: bytes) -> None:
        self.epoch = epoch
        self.packets: list[bytes] = []

    async def watched(
        self, reads: bytes, replies: int, then: Callable[[list[Any]], tuple[bytes, int]]
    ) -> list[Any]:
        self.packets.append(reads)
        fields = [b"epoch", b"top", b"floor", b"s:aa", b"s:bb"]
        packet, count = then([b"OK", [self.epoch, b"5", b"1", b"2", None], fields, {b"cc"}, None])
        self.packets.append(packet)
        return [b"OK"] * (count - 1) + [[1, b"OK"]]


@given(session=_names, sequence=_names, named=st.none() | _names)
def test_fast_read_packet(session: str, sequence: str, named: str | None) -> None:
    key = f"p:{{{session}}}"
    fast = FastPath(_ByHand(), Retention(), lambda s: f"p:{{{s}}}")  # type: ignore[arg-type]
    tag = sequence_tag(sequence)
    fields = ["epoch", "top", "floor", "count", "nseq", "rf", "ra", f"s:{tag}"]
    if named is not None and sequence_tag(named) != tag:
        fields.append(f"s:{sequence_tag(named)}")
    plain = pack_one(("HMGET", f"{key}:m", *fields)) + pack_one(("LRANGE", f"{key}:q:{tag}", 0, -1))
    commands, head, base = fast.read(session, tag, named)
    assert (commands, base) == (None, 0)
    assert head + b"$1\r\n0\r\n$2\r\n-1\r\n" == plain


@given(
    session=_names,
    condition=st.sampled_from(
        [("always", ""), ("top_below", 7), ("floor_at_most", 3), ("no_sequence", "ab12")]
    ),
)
def test_teardown_packets(session: str, condition: tuple[str, Any]) -> None:
    base = f"p:{{{session}}}"
    wire = _Canned(b"e1")
    tomb = teardown.tombstone_head("ahead", "ahead_of_high_water")
    torn = asyncio.run(
        teardown.tear_down(
            wire,  # type: ignore[arg-type]
            base,
            "e1",
            condition,
            tomb,
            ttl_ms=60_000,
            nonce="n1",
        )
    )
    assert torn
    fields = ["epoch", "top", "floor", "nseq"]
    if condition[0] == "no_sequence":
        fields.append(f"s:{condition[1]}")
    reads = (
        ("WATCH", f"{base}:m"),
        ("HMGET", f"{base}:m", *fields),
        ("HKEYS", f"{base}:m"),
        ("SMEMBERS", f"{base}:g"),
        ("GET", f"{base}:t"),
    )
    assert wire.packets[0] == b"".join(map(pack_one, reads))
    keys = [f"{base}:{name}" for name in ("m", "i", "g", "k", "k2", "x")]
    keys += [f"{base}:q:{tag}" for tag in ("aa", "bb", "cc")]
    # The stone's time stamp is the call's own: taken from the packet, checked in its place.
    head = b'{"code": "ahead", "verdict": "ahead_of_high_water","id":"n1","at":'
    at = wire.packets[1].split(head, 1)[1].split(b"}", 1)[0].decode()
    assert at.isdigit()
    stone = head.decode() + at + "}"
    writes = (("MULTI",), ("DEL", *keys), ("SET", f"{base}:t", stone, "PX", 60_000), ("EXEC",))
    assert wire.packets[1] == b"".join(map(pack_one, writes))

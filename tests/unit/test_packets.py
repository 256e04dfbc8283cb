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


class _Canned:
    """Answers ``watched`` with the replies of live sessions of two sequences each."""

    def __init__(self, epoch: bytes, sessions: int) -> None:
        self.epoch = epoch
        self.sessions = sessions
        self.packets: list[bytes] = []

    async def watched(
        self, reads: bytes, replies: int, then: Callable[[list[Any]], tuple[bytes, int]]
    ) -> list[Any]:
        assert replies == 1 + 2 * self.sessions
        self.packets.append(reads)
        meta = [b"epoch", self.epoch, b"top", b"5", b"floor", b"1", b"nseq", b"2"]
        one = [[*meta, b"s:aa", b"5,1,1,0,3,0,0,a", b"s:bb", b"4,1,1,0,2,0,0,b"], {b"cc"}]
        packet, count = then([b"OK", *one * self.sessions])
        self.packets.append(packet)
        return [b"OK"] * (count - 1) + [[1, b"OK"]]


@given(session=_names, sequence=_names, named=st.none() | _names)
def test_fast_read_packet(session: str, sequence: str, named: str | None) -> None:
    key = f"p:{{{session}}}"
    fast = FastPath(None, Retention(), lambda s: f"p:{{{s}}}")  # type: ignore[arg-type]
    tag = sequence_tag(sequence)
    fields = ["epoch", "top", "floor", "count", "nseq", "rf", "ra", f"s:{tag}"]
    if named is not None and sequence_tag(named) != tag:
        fields.append(f"s:{sequence_tag(named)}")
    hmget, lrange = ("HMGET", f"{key}:m", *fields), ("LRANGE", f"{key}:q:{tag}")
    plain = pack_one(hmget) + pack_one((*lrange, 0, -1))
    commands, head, base = fast.read(session, tag, named)
    assert (commands, base) == ((hmget, lrange), 0)  # the same read, for redis-py
    assert head + b"$1\r\n0\r\n$2\r\n-1\r\n" == plain


_conditions = st.sampled_from(
    [("always", ""), ("top_below", 7), ("floor_at_most", 3), ("no_sequence", "ab12")]
)


@given(batch=st.lists(st.tuples(_names, _conditions), min_size=1, max_size=3))
def test_teardown_packets(batch: list[tuple[str, tuple[str, Any]]]) -> None:
    wire = _Canned(b"e1", len(batch))
    tomb = teardown.tombstone_head("ahead", "ahead_of_high_water")
    requests = [
        teardown.Teardown(f"p:{{{session}}}", "e1", condition, tomb, 60_000, f"n{i}")
        for i, (session, condition) in enumerate(batch)
    ]
    torn = asyncio.run(teardown.tear_down(wire, requests))  # type: ignore[arg-type]
    assert torn == [True] * len(batch)
    reads: list[tuple[Any, ...]] = [("WATCH", *(f"{r.base}:m" for r in requests))]
    keys: list[str] = []
    sets: list[tuple[Any, ...]] = []
    for i, r in enumerate(requests):
        reads += [("HGETALL", f"{r.base}:m"), ("SMEMBERS", f"{r.base}:g")]
        keys += [f"{r.base}:{name}" for name in ("m", "i", "g", "k", "k2", "x")]
        keys += [f"{r.base}:q:{tag}" for tag in ("aa", "bb", "cc")]
        # The stone's time stamp is the call's own: taken from the packet, checked in its place.
        head = b'{"code": "ahead", "verdict": "ahead_of_high_water","id":"n%d","at":' % i
        at = wire.packets[1].split(head, 1)[1].split(b"}", 1)[0].decode()
        assert at.isdigit()
        sets.append(("SET", f"{r.base}:t", head.decode() + at + "}", "PX", 60_000))
    assert wire.packets[0] == b"".join(map(pack_one, reads))
    writes = [("MULTI",), ("DEL", *keys), *sets, ("EXEC",)]
    assert wire.packets[1] == b"".join(map(pack_one, writes))

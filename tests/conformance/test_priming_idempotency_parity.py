"""Priming events, idempotency keys, and the whole observable answer compared across backends.

Runs against every backend case; the comparison test also runs each step on a
private ``memory://`` reference in the same test and requires the same
evidence (every field) and the same ``session_info`` (sequence order included),
with only the epochs (random per incarnation) and times normalised.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from replaystore import (
    Cursor,
    InvalidInputError,
    ReplayBuffer,
    SequenceInfo,
    UnknownSessionError,
    Verdict,
)
from replaystore.testing.damage import lose_event

from ._support import bare, check_resumed, pos

pytestmark = pytest.mark.anyio

S = "sess-rules"


# -- priming events -------------------------------------------------------------


async def test_priming_storm_does_not_evict_a_running_sequence(make_buffer):
    """max_events=10: twelve reconnects of the GET stream, each with a priming
    event, must not push a running tool's real event out of retention."""
    buf = await make_buffer(max_events=10)
    await buf.open_session(S)
    tool = await buf.append(S, "tool-7", b"progress 1")
    primes = [await buf.append(S, "_GET_stream", None) for _ in range(12)]
    assert len(set(primes)) == 1  # the newest priming event stands for all of them
    info = await buf.session_info(S)
    assert (info.floor, info.high_water, info.retained) == (1, 2, 2)
    later = await buf.append(S, "tool-7", b"result")
    res = await buf.resolve_and_replay(S, tool)
    check_resumed(res, [(later, "tool-7", pos(later), b"result")], "tool-7")
    # the priming cursor the clients hold still resumes (nothing missed)
    res = await buf.resolve_and_replay(S, primes[-1], "_GET_stream")
    check_resumed(res, [], "_GET_stream")


async def test_priming_event_after_real_events_is_stored(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    first = await buf.append(S, "g", None)
    data = await buf.append(S, "g", b"x")
    second = await buf.append(S, "g", None)
    again = await buf.append_many(S, "g", [None, None])
    assert [pos(i) for i in (first, data, second)] == [1, 2, 3]
    assert again == [second, second]
    res = await buf.resolve_and_replay(S, first)
    check_resumed(res, [(data, "g", 2, b"x"), (second, "g", 3, None)], "g")
    # another sequence in between does not matter: g's newest event is priming
    await buf.append(S, "h", b"y")
    assert await buf.append(S, "g", None) == second


async def test_priming_rule_per_sequence_and_after_eviction(make_buffer):
    buf = await make_buffer(max_events=2)
    await buf.open_session(S)
    p1 = await buf.append(S, "g", None)
    await buf.append_many(S, "t", [b"1", b"2"])  # evicts g's priming event
    info = await buf.session_info(S)
    assert info.sequences == {"g": SequenceInfo(2, 1, 0), "t": SequenceInfo(2, 3, 2)}
    # g's newest event is no longer retained: a priming event is stored again,
    # so the client holds an id the store keeps
    p2 = await buf.append(S, "g", None)
    assert pos(p2) == 4
    assert p2 != p1
    assert Cursor.parse(p2).ordinal == 1  # g goes on where it stopped
    # nothing of g after p1 was evicted: p1 still resumes, exactly
    res = await buf.resolve(S, p1)
    assert res.verdict is Verdict.RESUMED and res.sequence == "g"


# -- idempotency keys -------------------------------------------------------------


async def test_idempotency_key_returns_the_first_ids(make_buffer):
    one = await make_buffer()
    info = await one.open_session(S)
    a = await one.append(S, "q", b"a", idempotency_key="req-1")
    again = await one.append(S, "q", b"a", idempotency_key="req-1")
    assert again == a
    batch = await one.append_many(S, "q", [b"b", None], idempotency_key="req-2")
    assert await one.append_many(S, "q", [b"b", None], idempotency_key="req-2") == batch
    unkeyed = await one.append(S, "q", b"c")
    assert [pos(i) for i in (a, *batch, unkeyed)] == [1, 2, 3, 4]
    res = await one.resolve_and_replay(S, str(info.origin))
    assert [e.payload for e in res.events] == [b"a", b"b", None, b"c"]
    with pytest.raises(InvalidInputError):
        await one.append_many(S, "q", [b"x"], idempotency_key="req-2")
    with pytest.raises(InvalidInputError):
        await one.append(S, "q", b"x", idempotency_key="")
    assert (await one.session_info(S)).high_water == 4


async def test_idempotency_keys_are_per_session_and_incarnation(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    await buf.open_session("other")
    a = await buf.append(S, "q", b"a", idempotency_key="k")
    b = await buf.append("other", "q", b"b", idempotency_key="k")
    assert Cursor.parse(a).epoch != Cursor.parse(b).epoch
    assert await buf.close_session(S)
    with pytest.raises(UnknownSessionError):
        await buf.append(S, "q", b"a", idempotency_key="k")
    info = await buf.open_session(S)
    fresh = await buf.append(S, "q", b"a", idempotency_key="k")
    assert Cursor.parse(fresh).epoch == info.epoch != Cursor.parse(a).epoch


async def test_idempotency_keys_seen_by_every_replica(make_buffer):
    from ._support import replica

    one = await make_buffer()
    two = await replica(make_buffer, one)
    await one.open_session(S)
    first = await one.append(S, "q", b"x", idempotency_key="same")
    assert await two.append(S, "q", b"x", idempotency_key="same") == first
    assert (await two.session_info(S)).high_water == 1


async def test_many_idempotency_keys_stay_bounded_but_recent_ones_hold(make_buffer):
    buf = await make_buffer(max_events=50)
    await buf.open_session(S)
    ids = [await buf.append(S, "q", b"%d" % i, idempotency_key=f"k{i}") for i in range(1100)]
    # the newest thousand are remembered
    for i in (1099, 500, 100):
        assert await buf.append(S, "q", b"%d" % i, idempotency_key=f"k{i}") == ids[i]
    assert (await buf.session_info(S)).high_water == 1100


# -- the whole answer, compared with a memory reference ---------------------------


_STAMP = re.compile(r"(\.[0-9a-f]{16}\.[0-9]+)\.[0-9]+")


def _normal(value: Any, epochs: dict[str, str]) -> Any:
    """Evidence/info as plain data with epochs renamed in order of appearance, times dropped."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):  # as pairs: the order is part of the answer
        return [(k, _normal(v, epochs)) for k, v in value.items() if k != "at"]
    if isinstance(value, list | tuple):
        return [_normal(v, epochs) for v in value]
    if isinstance(value, str):
        for epoch in sorted(epochs, key=len, reverse=True):
            value = value.replace(epoch, epochs[epoch])
        value = _STAMP.sub(r"\1.<stamp>", value)  # when it was stored: a clock reading
    return value


async def _script(buf: ReplayBuffer, case_damage: Any) -> list[Any]:
    """A fixed story; returns everything observable, normalised."""
    epochs: dict[str, str] = {}
    seen: list[Any] = []

    def note(value: Any) -> None:
        seen.append(_normal(value, epochs))

    async def resolve(cursor: str, named: str | None = None, replay: bool = True) -> None:
        call = buf.resolve_and_replay if replay else buf.resolve
        res = await call(S, cursor, named)
        note((res.verdict.value, res.sequence, res.evidence.as_dict()))
        note([(e.event_id, e.sequence, e.position, e.payload) for e in res.events])

    info = await buf.open_session(S)
    epochs[info.epoch] = "E1"
    ids = {}
    for seq, payloads in [
        ("a", [b"a1", None]),
        ("b", [b"b1"]),
        ("a", [b"a2"]),
        ("c", [None]),
        ("c", [None]),
        ("b", [b"b2", b"b3"]),
        ("a", [b""]),
    ]:
        ids.setdefault(seq, []).extend(await buf.append_many(S, seq, payloads))
    note(ids)
    note(await buf.session_info(S))
    origin = str(info.origin)
    for cursor, named in [
        (origin, None),
        (origin, "c"),
        (origin, "zz"),
        (ids["a"][0], None),
        (bare(ids["a"][0]), None),
        (ids["b"][0], "a"),
        (f"{info.epoch}-99", None),
        ("0123456789ab-1", None),
        ("junk", None),
    ]:
        await resolve(cursor, named, replay=False)
    await resolve(ids["a"][0])
    await resolve(bare(ids["b"][1]), "b")
    # eviction (count), then the same cursors again
    more = await buf.append_many(S, "d", [b"d"] * 5)
    note(more)
    note(await buf.session_info(S))
    for cursor in (ids["a"][0], ids["b"][2], more[0], origin):
        await resolve(cursor, replay=False)
    await case_damage(buf, S, Cursor.parse(more[2]).position)
    for cursor in (more[0], more[2], more[3], bare(more[0])):
        await resolve(cursor, replay=False)
    await resolve(more[3])
    await resolve(more[0])  # not_retained: torn down
    note(await buf.session_info(S))
    await resolve(more[3])  # unknown_session, with the tombstone
    return seen


async def test_whole_answers_equal_a_memory_reference(make_buffer, case):
    under_test = await make_buffer(max_events=10)
    reference = ReplayBuffer.from_url("memory://", max_events=10)
    async with reference:
        want = await _script(reference, lose_event)
    got = await _script(under_test, case.damage)
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, (index, g, w)

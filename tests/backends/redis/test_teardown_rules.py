"""The failures ``facts.lua`` tears down itself are exactly those ``rules.judge`` decides.

``facts.lua`` decides the common failed reconnects (malformed, foreign, ahead,
evicted, mismatch) in Lua so that reading the facts and tearing the session
down is one call. The rules stay in ``replaystore/rules.py``: for many
generated sessions and cursors, the script's decision is compared with the
judge's on the same facts, on fakeredis and on a real Redis. The script may
leave a case to the client (then the client judges and tears down with
``close.lua``), but it must never decide a code the judge does not reach, and
for malformed, foreign and ahead cursors it must always decide.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import fakeredis
import pytest

from replaystore import Cursor, ReplayBuffer, Verdict
from replaystore.backends.redis.replies import decode_facts
from replaystore.backends.redis.scripts import SLOT
from replaystore.cursor import CursorError, sequence_tag
from replaystore.rules import judge
from replaystore.testing.servers import ServerHandle
from replaystore.verdicts import REASONS

pytestmark = pytest.mark.anyio

SEQUENCES = ("a", "b", "c")
#: Always decided in Lua when the rules reach them (nothing else to read).
ALWAYS = {"malformed", "foreign", "ahead"}


def _cursors(rng: random.Random, ids: list[str], epoch: str) -> list[str | None]:
    """Cursors of every kind for one session: issued ids (retained or evicted),
    without their hint, with another stamp, ahead, foreign, the origin, garbage."""
    out: list[str | None] = [None, f"{epoch}-0", f"{'0' * 12}-1", f"{epoch}-{len(ids) + 5}"]
    for _ in range(6):
        c = Cursor.parse(rng.choice(ids))
        assert c.tag is not None and c.ordinal is not None and c.stamp is not None
        other_tag = sequence_tag(rng.choice(SEQUENCES))
        out += [
            str(c),
            str(c.bare),
            f"{c.epoch}-{c.position}.{c.tag}.{c.ordinal}.{c.stamp + 1}",
            f"{c.epoch}-{c.position}.{other_tag}.{c.ordinal}.{c.stamp}",
            f"{c.epoch}-{c.position + rng.randint(1, 40)}.{c.tag}.{c.ordinal + 1}.{c.stamp}",
            f"{'f' * 12}-{c.position}.{c.tag}.{c.ordinal}.{c.stamp}",
        ]
    return out


async def _facts(
    backend: Any, session: str, cursor: Cursor | None, named: str | None, spec: str
) -> list[Any]:
    """``facts.lua``'s reply, with the lists it asks for declared (as ``resolve`` does)."""
    declared = [t for t in (cursor.tag if cursor else None, named and sequence_tag(named)) if t]
    for _ in range(8):
        args = backend._facts_args(cursor, named, replay=True, teardown=spec)
        out = await backend._run("facts", session, sorted(set(declared)), args, retry=False)
        if out[SLOT["status"]] != b"need":
            return out
        declared.append(out[SLOT["need_tag"]].decode())
    raise AssertionError("facts.lua kept asking for lists")


async def _compare(url: str, prefix: str, client: Any, seed: int, sessions: int) -> Counter[str]:
    rng = random.Random(seed)
    decided: Counter[str] = Counter()
    options: dict[str, Any] = {"prefix": prefix}
    if client is not None:
        options["client"] = client
    for n in range(sessions):
        max_events = rng.randint(2, 12)
        async with ReplayBuffer.from_url(url, max_events=max_events, **options) as buf:
            backend: Any = buf.backend
            session = f"s{n}"
            info = await buf.open_session(session)
            ids: list[str] = []
            for _ in range(rng.randint(1, 30)):
                seq = rng.choice(SEQUENCES[: rng.randint(1, 3)])
                if rng.random() < 0.2:
                    ids += await buf.append_many(session, seq, [b"x"] * rng.randint(2, 5))
                else:
                    ids.append(await buf.append(session, seq, b"y"))
            spec = f"60000,{n:016x}"
            cursors = _cursors(rng, ids, info.epoch)
            rng.shuffle(cursors)
            for raw in cursors:
                try:
                    cursor = None if raw is None else Cursor.parse(raw)
                except CursorError:
                    cursor = None
                named = rng.choice((None, None, *SEQUENCES, "zz"))
                # The judge's code on facts read without a teardown ...
                out = await _facts(backend, session, cursor, named, "")
                assert out[SLOT["status"]] == b"ok"
                expected = judge(decode_facts(out), cursor, named).code
                # ... and the script's decision on the same state (nothing changed
                # in between: no appends, no age limit), which tears down.
                out = await _facts(backend, session, cursor, named, spec)
                if out[SLOT["status"]] == b"torn":
                    code = out[SLOT["torn"]].decode()
                    assert code == expected, (raw, named, code, expected)
                    assert judge(decode_facts(out), cursor, named).code == code
                    decided[code] += 1
                    # The tombstone is what close.lua would have left for that verdict.
                    res = await buf.resolve_and_replay(session, raw or "junk")
                    assert res.verdict is Verdict.UNKNOWN_SESSION
                    assert res.evidence.tombstone is not None
                    assert res.evidence.tombstone.verdict is not None
                    assert res.evidence.tombstone.verdict is REASONS[code][0]
                    break
                assert out[SLOT["status"]] == b"ok", out[SLOT["status"]]
                assert expected not in ALWAYS, (raw, named, expected)
                decided["left to the client: " + expected] += 1
    return decided


async def test_lua_teardown_agrees_with_the_rules_on_fakeredis(prefix: str) -> None:
    client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    decided = await _compare("redis://", prefix, client, seed=17, sessions=150)
    for code in ("malformed", "foreign", "ahead", "evicted", "mismatch"):
        assert decided[code] > 0, decided


@pytest.mark.realserver
@pytest.mark.parametrize("kind", ["redis", "valkey"])
async def test_lua_teardown_agrees_with_the_rules(
    kind: str, request: pytest.FixtureRequest, prefix: str
) -> None:
    server: ServerHandle = request.getfixturevalue("real_servers").shared(kind)
    decided = await _compare(server.url, prefix, None, seed=23, sessions=150)
    for code in ("malformed", "foreign", "ahead", "evicted", "mismatch"):
        assert decided[code] > 0, decided

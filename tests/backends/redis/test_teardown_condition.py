"""A failed verdict's teardown condition: the Lua rule and its Python copy agree, case by case.

The condition (is the session still the incarnation judged, does the verdict
still hold) is written twice because it runs in two places: in ``_lib.lua``
(``still_holds``, behind ``fail.lua`` and ``close.lua``) and in Python
(:func:`~replaystore.backends.redis.teardown.still_holds`, behind the
optimistic transaction of native commands). One table of cases holds every
one of them: the Python function, both scripts on fakeredis and on a real
Redis, and the whole transaction on a real Redis. The numbers are chosen so
that comparing them as text would answer wrongly ("10" < "9").
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis

from replaystore.backends.redis.keys import meta, session_keys, tombstone
from replaystore.backends.redis.scripts import Library
from replaystore.backends.redis.teardown import Teardown, still_holds, tear_down
from replaystore.backends.redis.wire import wire_for
from replaystore.testing.servers import ServerHandle

pytestmark = pytest.mark.anyio

#: The meta hash every case starts from (the fields the condition reads, and
#: one sequence of tag ``aa``); a case changes some of them.
META = {"epoch": "e1", "top": "10", "floor": "3", "nseq": "2", "s:aa": "10,1,3,3,11,3,0,a"}

#: (changes to META, expected epoch, condition, value, whether it holds)
CASES: list[tuple[dict[str, str], str, str, str, bool]] = [
    ({}, "e1", "always", "", True),
    ({}, "", "always", "", True),  # a close: any incarnation
    ({}, "e0", "always", "", False),  # another incarnation
    ({}, "e0", "top_below", "99", False),  # another incarnation, whatever the condition
    ({}, "e1", "top_below", "11", True),
    ({}, "e1", "top_below", "10", False),
    ({}, "e1", "top_below", "9", False),
    ({"top": "9"}, "e1", "top_below", "10", True),
    ({}, "e1", "no_sequence", "bb", True),
    ({}, "e1", "no_sequence", "aa", False),
    ({}, "e0", "no_sequence", "bb", False),
    ({"floor": "1"}, "e1", "ambiguous", "", True),
    ({"floor": "1", "nseq": "10"}, "e1", "ambiguous", "", True),
    ({"floor": "1", "nseq": "1"}, "e1", "ambiguous", "", False),
    ({"floor": "2"}, "e1", "ambiguous", "", False),
    ({}, "e1", "ambiguous", "", False),
    ({}, "e1", "floor_at_most", "3", True),
    ({}, "e1", "floor_at_most", "4", True),
    ({}, "e1", "floor_at_most", "2", False),
    ({"floor": "10"}, "e1", "floor_at_most", "9", False),
    ({"floor": "9"}, "e1", "floor_at_most", "10", True),
]

TOMB = '{"code":"ahead","verdict":"ahead_of_high_water"'
TTL_MS = 60_000


def _fields(changes: dict[str, str]) -> dict[str, str]:
    return {**META, **changes}


def _base(n: int) -> str:
    return f"tc{time.monotonic_ns()}:{{c{n}}}"


@pytest.mark.parametrize(("changes", "epoch", "condition", "value", "holds"), CASES)
def test_python_copy(
    changes: dict[str, str], epoch: str, condition: str, value: str, holds: bool
) -> None:
    fields = {k.encode(): v.encode() for k, v in _fields(changes).items()}
    assert still_holds(fields, epoch, condition, value) is holds


def _args(script: str, epoch: str, condition: str, value: str, nonce: str) -> list[Any]:
    """The script's ARGV after the list count (none declared)."""
    if script == "fail":
        return [epoch, condition, value, TOMB, TTL_MS, nonce, int(time.time() * 1000)]
    return [TOMB, TTL_MS, nonce, epoch, condition, value]


@pytest.fixture(params=["fakeredis", "redis"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """fakeredis (scripts), or a real Redis (functions, as a server that takes them runs it)."""
    if request.param == "fakeredis":
        yield fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
        return
    server: ServerHandle = request.getfixturevalue("real_servers").shared("redis")
    real = aioredis.Redis.from_url(server.url)
    yield real
    await real.aclose()


async def _run(client: Any, script: str, base: str, args: list[Any]) -> list[Any]:
    async def send(command: tuple[Any, ...]) -> Any:
        return await client.execute_command(*command)

    library = Library(send, functions=not isinstance(client, fakeredis.FakeAsyncRedis))
    keys = session_keys(base)
    return list(await library.call(script, lambda: (keys, [0, *args])))


@pytest.mark.parametrize("script", ["fail", "close"])
async def test_lua(client: Any, script: str) -> None:
    for n, (changes, epoch, condition, value, holds) in enumerate(CASES):
        base = _base(n)
        await client.hset(meta(base), mapping=_fields(changes))
        nonce = f"{n:016x}"
        out = await _run(client, script, base, _args(script, epoch, condition, value, nonce))
        case = (changes, epoch, condition, value)
        assert out[0] == int(holds), case
        assert bool(await client.exists(meta(base))) is not holds, case
        stone = await client.get(tombstone(base))
        assert (stone is not None and f'"id":"{nonce}"'.encode() in stone) is holds, case
        if holds:
            assert out[1:] == [b"aa"], case  # the lists left to delete
            # Sent again (its reply lost): the session is gone, torn down by this nonce.
            again = await _run(client, script, base, _args(script, epoch, condition, value, nonce))
            assert again == [1], case
            other = await _run(client, script, base, _args(script, epoch, condition, value, "x"))
            assert other == [0], case


async def test_python_transaction(redis_server: ServerHandle) -> None:
    """The transaction ``tear_down`` sends by hand, on the same table."""
    client = aioredis.Redis.from_url(redis_server.url)
    wire = wire_for(client)
    transactions = wire.transactions
    assert transactions is not None  # else the transaction is not what runs
    try:
        for n, (changes, epoch, condition, value, holds) in enumerate(CASES):
            base = _base(n)
            await client.hset(meta(base), mapping=_fields(changes))
            request = Teardown(base, epoch, (condition, value), TOMB, TTL_MS, f"{n:016x}")
            case = (changes, epoch, condition, value)
            assert await tear_down(transactions, [request]) == [holds], case
            assert bool(await client.exists(meta(base))) is not holds, case
            if holds:
                assert await tear_down(transactions, [request]) == [True], case  # its reply lost
    finally:
        await wire.give_back()
        await client.aclose()

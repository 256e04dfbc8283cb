"""Where a replay's Redis time goes: the cost of the building blocks inside one script.

    python -m benchmarks.lua_probe

``resolve.lua`` walks a sequence hop by hop: per replayed event one
single-entry ``XRANGE`` (the record) and one ``HGET`` on the links hash (the
next position). This probe times, as server time per script call from
``INFO commandstats``, an empty script, 100 single-entry ``XRANGE`` calls, 100
``HGET`` calls and one ``XRANGE`` of 100 entries turned into a Lua table, next
to the real ``resolve_and_replay`` of 100 events, all on one session of 101
events of one sequence. It prints ratios to the empty script; the absolute
numbers depend on the machine's load.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio as aioredis

from replaystore import ReplayBuffer

from .common import client, payload, redis_server

_BLOCKS = {
    "empty script": "return 1",
    "100 single-entry XRANGE (one per hop)": (
        "local n = 0 for i = 2, 101 do "
        "n = n + #redis.call('XRANGE', KEYS[1], i .. '-0', i .. '-0') end return n"
    ),
    "100 HGET on the links hash": (
        "local n = 0 for i = 1, 100 do "
        "if redis.call('HGET', KEYS[2], i) then n = n + 1 end end return n"
    ),
    "1 XRANGE of 100 entries into a Lua table": (
        "local r = redis.call('XRANGE', KEYS[1], '(1-0', '+', 'COUNT', 100) "
        "local out = {} for _, e in ipairs(r) do "
        "table.insert(out, e[1]); table.insert(out, e[2][8]) end return #out"
    ),
}


async def _server_us(r: aioredis.Redis, run: Any, times: int) -> float:
    await r.config_resetstat()
    for _ in range(times):
        await run()
    info: dict[str, Any] = await r.info("commandstats")
    return round(float(info["cmdstat_evalsha"]["usec"]) / times, 1)


async def probe(url: str, times: int = 200) -> dict[str, float]:
    r = client(url)
    try:
        async with ReplayBuffer.from_url(
            "redis://", client=r, prefix="probe:", max_events=10_000
        ) as buf:
            await buf.open_session("p")
            ids = await buf.append_many("p", "s1", [payload(i) for i in range(101)])
            base = "probe:{p}"
            keys = [f"{base}:e", f"{base}:n"]
            out: dict[str, float] = {}
            for name, source in _BLOCKS.items():
                sha = await r.script_load(source)

                async def call(sha: str = sha) -> object:
                    return await r.evalsha(sha, 2, *keys)

                out[name] = await _server_us(r, call, times)

            async def replay() -> object:
                return await buf.resolve_and_replay("p", ids[0])

            out["resolve_and_replay (100 events)"] = await _server_us(r, replay, times)
    finally:
        await r.aclose()
    return out


def main() -> int:
    with redis_server() as handle:
        result = asyncio.run(probe(handle.url))
    empty = result["empty script"]
    for name, us in result.items():
        print(f"{name:<44} {us:>9.1f} us  {us / empty:>7.1f}x empty script")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

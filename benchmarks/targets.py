"""The Redis cost targets: each figure a ratio to a raw-command baseline measured in the same run.

    python -m benchmarks.targets [--quick]

Every subject goes through the public ``ReplayBuffer`` on a real Redis started
for the run (never the machine's 6379) and is paired with the raw command it
is built on, over the same client and connection style:

* wall clock: median time per awaited call over alternating rounds
  (``common.paired``);
* Redis CPU: the server's own ``used_cpu_user + used_cpu_sys`` (``INFO cpu``),
  delta over many calls per round, alternating subject and baseline rounds, on
  a server with no other client; the figure that sets how many resumes one
  Redis core serves. ``INFO commandstats`` server time is recorded beside it
  (``commandstats_us``: where the time goes).

Figures missed are reported with their value; the table marks them.

The resume at the HTTP floor is judged in instructions, not seconds
(``benchmarks.resume_instructions``: the server process under callgrind, the
raw ASGI floor and the SDK's example store measured in the same run, each
twice): ``INSTRUCTION_TARGETS``. A machine without valgrind reports them as
skipped, saying why; ``--quick`` and ``--no-instructions`` leave them out.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from replaystore import ReplayBuffer

from . import resume_instructions
from .common import FULL, QUICK, Sizes, client, commandstats, paired, payload, redis_server

Op = Callable[[int], Awaitable[object]]

#: (id, what, limit) of every target; ``limit`` is the largest ratio allowed.
TARGETS: list[tuple[str, str, float]] = [
    ("replay100.wall", "resolve_and_replay of 100 / raw XRANGE COUNT 100, wall", 1.05),
    ("replay100.cpu", "resolve_and_replay of 100 / raw XRANGE COUNT 100, Redis CPU", 1.0),
    ("replay10.wall", "resolve_and_replay of 10 / raw XRANGE COUNT 10, wall", 1.3),
    ("replay10.cpu", "resolve_and_replay of 10 / raw XRANGE COUNT 10, Redis CPU", 1.5),
    ("append.wall", "append of one event / raw XADD, wall", 1.3),
    ("append_vs_floor.cpu", "append of one event / the Lua floor, Redis CPU", 1.25),
    (
        "append_in_turn_vs_floor.cpu",
        "append, three sequences in turn / the Lua floor, Redis CPU",
        1.25,
    ),
    ("append_at_cap.wall", "append at the retention cap / raw XADD MAXLEN, wall", 1.5),
    ("history.wall", "replay of 10 after 100,000 other events / fresh session, wall", 1.05),
    ("memory.long", "bytes per event, long sequences / bare stream", 1.1),
    ("memory.short", "bytes per event, many 5-event sequences / bare stream", 1.7),
    ("concurrent32.cpu", "Redis CPU per resume of 10, 32 concurrent callers / raw read", 1.3),
]


#: (id, what, limit, (server, case)) of the resume targets counted in instructions; each a
#: ratio of net instructions per resume to the raw ASGI floor's, or to the SDK example store's.
INSTRUCTION_TARGETS: list[tuple[str, str, float, str]] = [
    ("resume_ir.sticky", "resume on the replica that ran the call / raw ASGI floor, Ir", 1.25,
     "replaystore/sticky"),
    ("resume_ir.rr", "resume on another replica (session adopted) / raw ASGI floor, Ir", 1.4,
     "replaystore/rr"),
    ("resume_ir.failed", "failed resume (foreign cursor, 404) / raw ASGI floor, Ir", 1.5,
     "replaystore/failed"),
    ("resume_ir.sdk", "resume on the replica that ran the call / SDK example store, Ir", 0.5,
     "replaystore/sticky"),
]  # fmt: skip

#: Two runs of one instruction figure further apart than this are reported as unsteady.
INSTRUCTION_AGREEMENT = 0.01

#: A Redis function doing only what every atomic append has to (see ``measure``).
_FLOOR_LIBRARY = """#!lua name=replaystore_bench_floor
redis.register_function('replaystore_bench_floor', function(keys, argv)
  local meta = redis.call('HMGET', keys[1], 'epoch', 'top', 'count')
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local top = tonumber(meta[2]) + 1
  redis.call('RPUSH', keys[2], top .. ',' .. now .. ':' .. argv[1])
  redis.call('HSET', keys[1], 'top', top, 'count', meta[3] + 1)
  return {meta[1], 'ok', top .. '.' .. now}
end)
"""


async def _cpu(r: aioredis.Redis) -> float:
    info: dict[str, Any] = await r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def cpu_pair(
    admin: aioredis.Redis, subject: Op, baseline: Op, *, calls: int, rounds: int
) -> dict[str, float]:
    """Redis CPU per call of each, alternating rounds; medians, their ratio, commandstats time."""
    s_cpu: list[float] = []
    b_cpu: list[float] = []
    s_stat: list[float] = []
    b_stat: list[float] = []
    for r in range(rounds):
        order = [(subject, s_cpu, s_stat), (baseline, b_cpu, b_stat)]
        if r % 2:
            order.reverse()
        for op, sink, stat_sink in order:
            await admin.config_resetstat()
            before = await _cpu(admin)
            for i in range(calls):
                await op(i)
            after = await _cpu(admin)
            stats = await commandstats(admin)
            usec = sum(
                u for name, (_, u) in stats.items() if name not in ("info", "config|resetstat")
            )
            sink.append((after - before) / calls * 1e6)
            stat_sink.append(usec / calls)
    s, b = statistics.median(s_cpu), statistics.median(b_cpu)
    return {
        "subject_cpu_us": round(s, 2),
        "baseline_cpu_us": round(b, 2),
        "ratio": round(s / b, 3),
        "subject_commandstats_us": round(statistics.median(s_stat), 2),
        "baseline_commandstats_us": round(statistics.median(b_stat), 2),
    }


async def _concurrent_cpu(
    url: str,
    admin: aioredis.Redis,
    subject: Op,
    baseline: Op,
    *,
    tasks: int,
    calls: int,
    rounds: int,
) -> dict[str, float]:
    async def many(op: Op) -> None:
        async def worker(w: int) -> None:
            for i in range(calls):
                await op(w * calls + i)

        await asyncio.gather(*(worker(w) for w in range(tasks)))

    async def subject_all(_: int) -> object:
        await many(subject)
        return None

    async def baseline_all(_: int) -> object:
        await many(baseline)
        return None

    out = await cpu_pair(admin, subject_all, baseline_all, calls=1, rounds=rounds)
    per = tasks * calls
    for key in (
        "subject_cpu_us",
        "baseline_cpu_us",
        "subject_commandstats_us",
        "baseline_commandstats_us",
    ):
        out[key] = round(out[key] / per, 2)
    out["callers"] = tasks
    return out


async def _memory(r: aioredis.Redis, sizes: Sizes) -> dict[str, Any]:
    """Bytes per retained event (``MEMORY USAGE ... SAMPLES 0`` over a session's keys)."""
    n = sizes.memory_events
    p = payload(0)
    out: dict[str, Any] = {}
    await r.delete("bare")
    for start in range(0, n, 1000):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(1000, n - start)):
            pipe.xadd("bare", {"d": p})
        await pipe.execute()
    bare = int(await r.memory_usage("bare", samples=0) or 0) / n
    out["bare_stream_bytes_per_event"] = round(bare, 1)
    await r.delete("bare")

    async def session_bytes(prefix: str) -> int:
        total = 0
        async for key in r.scan_iter(match=f"{prefix}*", count=1000):
            total += int(await r.memory_usage(key, samples=0) or 0)
        return total

    cases: dict[str, Callable[[ReplayBuffer], Awaitable[int]]] = {}

    async def long_one(buf: ReplayBuffer) -> int:
        for start in range(0, n, 500):
            await buf.append_many("S", "_GET_stream", [p] * min(500, n - start))
        return n

    async def long_five(buf: ReplayBuffer) -> int:
        for k, start in enumerate(range(0, n, 500)):
            await buf.append_many("S", f"seq{k % 5}", [p] * min(500, n - start))
        return n

    async def short_seqs(buf: ReplayBuffer) -> int:
        count = n // 5
        for s in range(count):
            await buf.append_many("S", str(s), [p] * 5)
        return count * 5

    async def short_interleaved(buf: ReplayBuffer) -> int:
        count = n // 5
        for group in range(0, count, 4):  # 4 calls in flight: their events interleave
            for _ in range(5):
                for s in range(group, min(count, group + 4)):
                    await buf.append("S", str(s), p)
        return count * 5

    cases["long: one sequence"] = long_one
    cases["long: 5 sequences, bursts of 500"] = long_five
    cases["short: 5-event sequences, one after another"] = short_seqs
    cases["short: 5-event sequences, 4 interleaved"] = short_interleaved
    for name, fill in cases.items():
        prefix = f"mem{len(out)}:"
        async with ReplayBuffer.from_url(
            "redis://", client=r, prefix=prefix, max_events=10 * n
        ) as buf:
            await buf.open_session("S")
            events = await fill(buf)
        used = await session_bytes(prefix)
        out[name] = {
            "events": events,
            "bytes_per_event": round(used / events, 1),
            "ratio_to_bare_stream": round(used / events / bare, 3),
        }
        async for key in r.scan_iter(match=f"{prefix}*", count=1000):
            await r.delete(key)
    return out


class _Run:
    """What every section of :func:`measure` shares: the clients, the sizes, the results."""

    def __init__(self, url: str, sizes: Sizes) -> None:
        self.url = url
        self.sizes = sizes
        self.r = client(url)
        self.admin = client(url)
        self.results: dict[str, Any] = {}
        self.cpu_calls = 300 if sizes.quick else 3000
        self.rounds = 3 if sizes.quick else 5
        self.payloads = [payload(i) for i in range(256)]

    async def wall_and_cpu(
        self, key: str, subject: tuple[str, Op], baseline: tuple[str, Op], *, ops: int, calls: int
    ) -> None:
        """One subject against its baseline: wall clock (``paired``) and Redis CPU."""
        row = await paired(key, "targets", subject, baseline, ops=ops, sizes=self.sizes)
        self.results[f"{key}.wall"] = row.as_dict()
        self.results[f"{key}.cpu"] = await cpu_pair(
            self.admin, subject[1], baseline[1], calls=calls, rounds=self.rounds
        )

    async def cpu_pair(self, key: str, subject: Op, baseline: Op) -> None:
        """Redis CPU alone, subject against baseline in alternating rounds."""
        self.results[key] = await cpu_pair(
            self.admin, subject, baseline, calls=self.cpu_calls, rounds=self.rounds
        )


async def measure(url: str, sizes: Sizes) -> dict[str, Any]:
    """Every target's figures, section by section, on the Redis at ``url``."""
    run = _Run(url, sizes)
    try:
        async with ReplayBuffer.from_url(
            "redis://", client=run.r, prefix="t:", max_events=10**7
        ) as buf:
            await _replays(run, buf)
            await _appends(run, buf)
        await _append_at_cap(run)
        await _history(run)
        await _concurrent(run)
        run.results["memory"] = await _memory(run.admin, sizes)
    finally:
        await run.r.aclose()
        await run.admin.aclose()
    return run.results


async def _replays(run: _Run, buf: ReplayBuffer) -> None:
    """Replay of 10 and 100 events against a raw ``XRANGE`` of as many."""
    r, payloads, sizes = run.r, run.payloads, run.sizes
    for n in (10, 100):
        session = f"replay{n}"
        await buf.open_session(session)
        ids = await buf.append_many(session, "s1", payloads[: n + 1])
        check = await buf.resolve_and_replay(session, ids[0])
        assert check.ok and len(check.events) == n, check
        raw_key = f"raw:replay{n}"
        pipe = r.pipeline(transaction=False)
        for p in payloads[: n + 1]:
            pipe.xadd(raw_key, {"d": p})
        raw_ids = await pipe.execute()
        after = b"(" + raw_ids[0]

        async def rs(i: int, s: str = session, c: str = ids[0]) -> object:
            return await buf.resolve_and_replay(s, c)

        async def raw(i: int, k: str = raw_key, a: bytes = after, n: int = n) -> object:
            return await r.xrange(k, min=a, count=n)

        await run.wall_and_cpu(
            f"replay{n}",
            ("replay", rs),
            ("raw", raw),
            ops=sizes.replay_ops * (4 if n == 10 else 2),
            calls=run.cpu_calls // (4 if n == 100 else 1),
        )


async def _appends(run: _Run, buf: ReplayBuffer) -> None:
    """An append against a raw ``XADD`` and against the Lua floor; the floor against ``XADD``."""
    r, payloads, sizes = run.r, run.payloads, run.sizes
    await buf.open_session("append")

    async def rs_append(i: int) -> object:
        return await buf.append("append", "s1", payloads[i % 256])

    async def raw_xadd(i: int) -> object:
        return await r.xadd("raw:xadd", {"d": payloads[i % 256]})

    await run.wall_and_cpu(
        "append",
        ("append", rs_append),
        ("raw", raw_xadd),
        ops=sizes.append_ops,
        calls=run.cpu_calls,
    )

    # The floor under any atomic append in Lua: the four commands an
    # append needs (read the bookkeeping, the clock, push, write the
    # bookkeeping) with no other logic. Not a target: it shows how much
    # of the append's cost is Redis's script machinery itself.
    await r.function_load(_FLOOR_LIBRARY, replace=True)
    await r.hset("floor:{f}:m", mapping={"epoch": "e", "top": 0, "count": 0})

    async def lua_floor(i: int) -> object:
        return await r.fcall(
            "replaystore_bench_floor", 2, "floor:{f}:m", "floor:{f}:q", payloads[i % 256]
        )

    await run.wall_and_cpu(
        "append_floor",
        ("floor", lua_floor),
        ("raw", raw_xadd),
        ops=sizes.append_ops,
        calls=run.cpu_calls,
    )

    # The append against that floor directly, in alternating rounds (a
    # ratio of two ratios to XADD would carry the noise of both). Also
    # with three sequences written in turn, as an MCP session's
    # streams are: each append then starts a run of its sequence.
    await run.cpu_pair("append_vs_floor.cpu", rs_append, lua_floor)
    await buf.open_session("in-turn")
    turn = ("_GET_stream", "1", "2")

    async def rs_in_turn(i: int) -> object:
        return await buf.append("in-turn", turn[i % 3], payloads[i % 256])

    await run.cpu_pair("append_in_turn_vs_floor.cpu", rs_in_turn, lua_floor)


async def _append_at_cap(run: _Run) -> None:
    """An append that evicts one event against ``XADD ... MAXLEN = cap``."""
    r, payloads, sizes = run.r, run.payloads, run.sizes
    cap = sizes.capped_retention
    async with ReplayBuffer.from_url("redis://", client=r, prefix="c:", max_events=cap) as capped:
        await capped.open_session("capped")
        for start in range(0, cap, 100):
            await capped.append_many("capped", "s1", payloads[: min(100, cap - start)])
        pipe = r.pipeline(transaction=False)
        for _ in range(cap):
            pipe.xadd("raw:capped", {"d": payloads[0]}, maxlen=cap, approximate=False)
        await pipe.execute()

        async def rs_capped(i: int) -> object:
            return await capped.append("capped", "s1", payloads[i % 256])

        async def raw_capped(i: int) -> object:
            return await r.xadd(
                "raw:capped", {"d": payloads[i % 256]}, maxlen=cap, approximate=False
            )

        await run.wall_and_cpu(
            "append_at_cap",
            ("capped", rs_capped),
            ("raw", raw_capped),
            ops=sizes.append_ops,
            calls=run.cpu_calls,
        )


async def _history(run: _Run) -> None:
    """A replay of 10 after 100,000 events of other sequences against one in a fresh session."""
    r, payloads, sizes = run.r, run.payloads, run.sizes
    others = 2000 if sizes.quick else 100_000
    async with ReplayBuffer.from_url(
        "redis://", client=r, prefix="h:", max_events=others + 1000
    ) as hist:
        for session in ("fresh", "old"):
            await hist.open_session(session)
        for k, start in enumerate(range(0, others, 500)):
            await hist.append_many("old", f"other{k % 5}", payloads[:1] * min(500, others - start))
        cursors = {}
        for session in ("fresh", "old"):
            ids = await hist.append_many(session, "mine", payloads[:11])
            cursors[session] = ids[0]

        async def fresh(i: int) -> object:
            return await hist.resolve_and_replay("fresh", cursors["fresh"])

        async def old(i: int) -> object:
            return await hist.resolve_and_replay("old", cursors["old"])

        await run.wall_and_cpu(
            "history",
            ("after 100,000 others", old),
            ("fresh", fresh),
            ops=sizes.replay_ops * 4,
            calls=run.cpu_calls,
        )


async def _concurrent(run: _Run) -> None:
    """Redis CPU per resume of 10 with 32 callers at once, against 32 raw readers."""
    url, payloads, sizes = run.url, run.payloads, run.sizes
    wide = aioredis.Redis.from_url(url, max_connections=64)
    try:
        async with ReplayBuffer.from_url(url, prefix="w:", max_events=10**7) as many:
            await many.open_session("wide")
            ids = await many.append_many("wide", "s1", payloads[:11])
            raw_key = "raw:replay10"  # written by _replays
            first = (await wide.xrange(raw_key, count=1))[0][0]

            async def rs_wide(i: int) -> object:
                return await many.resolve_and_replay("wide", ids[0])

            async def raw_wide(i: int) -> object:
                return await wide.xrange(raw_key, min=b"(" + first, count=10)

            run.results["concurrent32.cpu"] = await _concurrent_cpu(
                url,
                run.admin,
                rs_wide,
                raw_wide,
                tasks=32,
                calls=10 if sizes.quick else 100,
                rounds=run.rounds,
            )
    finally:
        await wide.aclose()


def summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: measured ratio, limit, met or not."""
    memory = results["memory"]
    measured = {
        "memory.long": memory["long: one sequence"]["ratio_to_bare_stream"],
        "memory.short": memory["short: 5-event sequences, one after another"][
            "ratio_to_bare_stream"
        ],
    }
    rows = []
    for target, what, limit in TARGETS:
        value = measured.get(target)
        if value is None:
            value = results[target]["ratio"]
        rows.append(
            {
                "id": target,
                "what": what,
                "limit": limit,
                "ratio": round(value, 3),
                "met": value <= limit,
            }
        )
    return rows


def instruction_summary(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per instruction target: ratio, limit, met, and whether its runs agreed.

    A target is met only when its ratio is within the limit and the runs of
    both figures it divides agreed within ``INSTRUCTION_AGREEMENT``: a ratio
    from runs that disagree proves nothing either way.
    """
    rows = []
    for target, what, limit, key in INSTRUCTION_TARGETS:
        row = report["rows"][key]
        base_key = "sdk-example/sticky" if target == "resume_ir.sdk" else "floor/sticky"
        ratio = row["vs_sdk_example" if target == "resume_ir.sdk" else "vs_floor"]
        spread = max(row["spread"], report["rows"][base_key]["spread"])
        steady = spread <= INSTRUCTION_AGREEMENT and not row["unexpected"]
        rows.append(
            {
                "id": target,
                "what": what,
                "limit": limit,
                "ratio": round(ratio, 3),
                "spread": round(spread, 4),
                "steady": steady,
                "met": steady and ratio <= limit,
            }
        )
    return rows


def render_instructions(report: dict[str, Any]) -> str:
    if "skipped" in report:
        return f"Instruction targets skipped: {report['skipped']}"
    lines = [f"{'target':<70} {'limit':>6} {'measured':>9}  ", "-" * 92]
    for row in instruction_summary(report):
        mark = "ok" if row["met"] else "MISSED" if row["steady"] else "UNSTEADY"
        lines.append(f"{row['what']:<70} {row['limit']:>5.2f}x {row['ratio']:>8.3f}x  {mark}")
    lines.append("")
    lines.append("Net instructions per resume (median of the runs; spread = (max - min) / min):")
    lines.append(resume_instructions.table(report))
    return "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    lines = [f"{'target':<70} {'limit':>6} {'measured':>9}  ", "-" * 92]
    for row in summary(results):
        mark = "ok" if row["met"] else "MISSED"
        lines.append(f"{row['what']:<70} {row['limit']:>5.2f}x {row['ratio']:>8.3f}x  {mark}")
    lines.append("")
    lines.append("Redis CPU per call (us), subject / baseline, and INFO commandstats time (us):")
    for key, value in results.items():
        if key.endswith(".cpu"):
            cpu = f"{value['subject_cpu_us']:>8.2f} / {value['baseline_cpu_us']:>8.2f}"
            stats = (
                f"{value['subject_commandstats_us']:>8.2f} / "
                f"{value['baseline_commandstats_us']:>8.2f}"
            )
            lines.append(f"  {key:<20} cpu {cpu}   commandstats {stats}")
    wall, cpu = results["append_floor.wall"]["ratio"], results["append_floor.cpu"]["ratio"]
    lines.append(
        "The floor of an atomic append in Lua (HMGET, TIME, RPUSH, HSET and nothing else)"
        f" / raw XADD: wall {wall:.3f}x, Redis CPU {cpu:.3f}x; append / floor:"
        f" wall {results['append.wall']['ratio'] / wall:.3f}x,"
        f" Redis CPU {results['append.cpu']['ratio'] / cpu:.3f}x"
    )
    lines.append(
        "Memory, bytes per event (x bare stream "
        f"{results['memory']['bare_stream_bytes_per_event']} B):"
    )
    for key, value in results["memory"].items():
        if isinstance(value, dict):
            per, ratio = value["bytes_per_event"], value["ratio_to_bare_stream"]
            lines.append(f"  {key:<50} {per:>7.1f}  {ratio:.3f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.targets", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--no-instructions", action="store_true", help="leave out the resume's instruction counts"
    )
    args = parser.parse_args(argv)
    with redis_server() as handle:
        results = asyncio.run(measure(handle.url, QUICK if args.quick else FULL))
    print(render(results))
    if not (args.quick or args.no_instructions):
        rows = sorted({key for *_, key in INSTRUCTION_TARGETS} | {"floor/sticky",
                      "sdk-example/sticky"})  # fmt: skip
        wanted = [r for r in resume_instructions.ROWS if "/".join(r) in rows]
        report = resume_instructions.run(resume_instructions.Workload(), rows=wanted)
        print()
        print(render_instructions(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Redis CPU of a failed reconnect against a good one, per kind of failure.

A reconnect storm full of stale cursors must not cost Redis much more than
one of good ones: a failed resume reads, judges and tears its session down
(and its lists go afterwards), a good one reads. On one throw-away
``redis-server`` per round, ``--sessions`` sessions per kind are opened with
two sequences of a few events each, then resumed once each, one call at a
time, with a cursor of that kind:

* ``good``: a cursor of sequence ``q``, resumed (three events replayed);
* ``foreign``: the same cursor with another epoch;
* ``ahead``: its position past the high-water;
* ``mismatch``: the cursor of ``q`` named as sequence ``r``;
* ``unknown_sequence``: the cursor named as a sequence the session lacks;
* ``evicted``: a cursor below the floor (retention of 8 events): the script's.

Redis CPU is the server's own ``used_cpu_user + used_cpu_sys`` (``INFO cpu``)
over the resumes of a kind, closing the buffer included (whatever a teardown
leaves to later, such as deleting lists, is counted), divided by the number
of resumes; ``INFO commandstats`` gives the commands per resume beside it, and
each command's server time per resume (an ``EXEC``'s includes the commands it
ran).
``good`` runs first and last, and the ratios are against the mean of the two.
``--src`` runs the resumes from another checkout of the repository (its
``replaystore`` package; repeatable), each in a process of its own, so two
commits are compared on the same server in the same minutes::

    python -m benchmarks.fail_cost [--src DIR ...] [--rounds 3] [--sessions 1000]
        [--concurrency 1] [--json PATH]

``--concurrency N`` keeps N resumes under way at a time, as a storm does:
failures that come together share their teardown transaction.

Only ratios within one round mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("good", "foreign", "ahead", "mismatch", "unknown_sequence", "evicted", "good")


def _cursor(kind: str, ids: list[str]) -> tuple[str, str | None]:
    """The cursor and the named sequence a reconnect of ``kind`` sends."""
    cursor = ids[1]
    epoch, rest = cursor.split("-", 1)
    position, hint = rest.split(".", 1)
    if kind == "foreign":
        return f"{'0' if epoch[0] != '0' else '1'}{epoch[1:]}-{rest}", None
    if kind == "ahead":
        return f"{epoch}-{int(position) + 1000}.{hint}", None
    if kind == "mismatch":
        return cursor, "r"
    if kind == "unknown_sequence":
        return cursor, "nope"
    if kind == "evicted":
        return ids[0], None
    return cursor, None


async def _cpu(admin: Any) -> float:
    info = await admin.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _kind(
    url: str, kind: str, sessions: int, admin: Any, concurrency: int = 1
) -> dict[str, Any]:
    """One kind: ``sessions`` sessions prepared, then resumed once each, measured.

    ``concurrency`` resumes are under way at a time (as in a storm).
    """
    from replaystore import ReplayBuffer, Verdict

    prefix = f"fc{uuid.uuid4().hex[:8]}:"
    buf = ReplayBuffer.from_url(url, prefix=prefix, max_events=8 if kind == "evicted" else 1000)
    await buf.__aenter__()
    calls: list[tuple[str, str, str | None]] = []
    for n in range(sessions):
        session = f"s{n}"
        await buf.open_session(session)
        ids = await buf.append_many(session, "q", [b"x" * 200] * 5)
        await buf.append_many(session, "r", [b"y" * 200] * (5 if kind == "evicted" else 2))
        cursor, named = _cursor(kind, ids)
        calls.append((session, cursor, named))
    await admin.config_resetstat()
    before = await _cpu(admin)
    verdicts: dict[str, int] = {}
    pending = iter(calls)

    async def resumer() -> None:
        for session, cursor, named in pending:
            res = await buf.resolve_and_replay(session, cursor, sequence=named)
            verdicts[res.verdict.value] = verdicts.get(res.verdict.value, 0) + 1
            if kind == "good":
                assert res.verdict is Verdict.RESUMED and len(res.events) == 3, res
            else:
                assert res.evidence.torn_down, res

    await asyncio.gather(*(resumer() for _ in range(concurrency)))
    await buf.aclose()
    after = await _cpu(admin)
    stats = await admin.info("commandstats")
    stats = {
        name.removeprefix("cmdstat_"): v
        for name, v in stats.items()
        if name != "cmdstat_info" and not name.startswith("cmdstat_config")
    }
    commands = {name: round(int(v["calls"]) / sessions, 2) for name, v in stats.items()}
    # Time inside commands (a script's includes the commands it runs).
    outer = [v for name, v in stats.items() if name in ("fcall", "evalsha", "eval")]
    inner = set() if not outer else {"fcall", "evalsha", "eval"}
    usec = sum(int(v["usec"]) for name, v in stats.items() if not inner or name in inner)
    left = 0
    async for _ in admin.scan_iter(match=f"{prefix}*:q:*", count=1000):
        left += 1
    return {
        "cpu_us": round((after - before) * 1e6 / sessions, 2),
        "command_us": round(usec / sessions, 2),
        "commands": dict(sorted(commands.items(), key=lambda kv: -kv[1])),
        "command_us_each": {
            name: round(int(v["usec"]) / sessions, 2)
            for name, v in sorted(stats.items(), key=lambda kv: -int(kv[1]["usec"]))
        },
        "verdicts": verdicts,
        "lists_left": left,
    }


async def _worker(url: str, sessions: int, concurrency: int) -> dict[str, Any]:
    import redis.asyncio as aioredis

    import replaystore

    admin = aioredis.Redis.from_url(url)
    try:
        out: dict[str, Any] = {"package": str(Path(replaystore.__file__).parent)}
        for i, kind in enumerate(KINDS):
            name = "good_end" if kind == "good" and i else kind
            out[name] = await _kind(url, kind, sessions, admin, concurrency)
        return out
    finally:
        await admin.aclose()


def _run_worker(src: Path, url: str, sessions: int, concurrency: int) -> dict[str, Any]:
    """The resumes of one round from checkout ``src``, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--worker",
            url,
            "--sessions",
            str(sessions),
            "--concurrency",
            str(concurrency),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _ratios(round_: dict[str, Any]) -> dict[str, float]:
    good = (round_["good"]["cpu_us"] + round_["good_end"]["cpu_us"]) / 2
    return {
        kind: round(round_[kind]["cpu_us"] / good, 2)
        for kind in KINDS[1:-1]
        if good > 0 and kind in round_
    }


def run(sources: list[Path], rounds: int, sessions: int, concurrency: int = 1) -> dict[str, Any]:
    """``rounds`` rounds, each on a fresh server, every source in turn."""
    from replaystore.testing.servers import redis_server_binary, start_standalone

    results: dict[str, list[dict[str, Any]]] = {str(s): [] for s in sources}
    for i in range(rounds):
        for src in sources:
            handle = start_standalone(redis_server_binary(), "redis")
            try:
                one = _run_worker(src, handle.url, sessions, concurrency)
            finally:
                handle.stop()
            one["ratios"] = _ratios(one)
            results[str(src)].append(one)
            print(f"  round {i + 1}, {src}: {one['ratios']}", file=sys.stderr)
    summary = {
        src: {kind: statistics.median(r["ratios"][kind] for r in rs) for kind in rs[0]["ratios"]}
        for src, rs in results.items()
    }
    return {
        "sessions": sessions,
        "concurrency": concurrency,
        "rounds": results,
        "median_ratios": summary,
    }


def render(results: dict[str, Any]) -> str:
    """Per source and round: good's CPU per resume, then each kind's and its ratio to good."""
    lines = [
        f"Redis CPU per resume (us) and ratio to a good resume, {results['sessions']} each,"
        f" {results.get('concurrency', 1)} at a time:"
    ]
    for src, rounds in results["rounds"].items():
        lines.append(f"{src}:")
        for i, r in enumerate(rounds):
            good = (r["good"]["cpu_us"] + r["good_end"]["cpu_us"]) / 2
            parts = [f"good {good:.1f}"] + [
                f"{kind} {r[kind]['cpu_us']:.1f} ({r['ratios'][kind]:.2f}x)" for kind in r["ratios"]
            ]
            lines.append(f"  round {i + 1}: " + ", ".join(parts))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", action="append", default=[], help="a checkout to run from")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument(
        "--concurrency", type=int, default=1, help="resumes under way at a time (a storm: 32)"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(_worker(args.worker, args.sessions, args.concurrency))))
        return
    sources = [Path(s).resolve() for s in args.src] or [ROOT]
    results = run(sources, args.rounds, args.sessions, args.concurrency)
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Run every benchmark against a throw-away Redis, print the tables, write JSON.

    python -m benchmarks.run [--quick] [--json out.json]

Run from the repository root: the Redis server is started by ``replaystore.testing``
on a free loopback port (never the machine's 6379) and stopped at the end.
``--quick`` uses tiny sizes (the smoke test's mode); its ratios are noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from .common import FULL, QUICK, Sizes, client, redis_server, settled_heap
from .memory import run_memory
from .micro import fastmcp_rows, replaystore_rows
from .targets import measure as measure_targets
from .targets import render as render_targets
from .targets import summary as target_summary

DEFAULT_JSON = Path(__file__).with_name("results.json")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


async def _run(url: str, sizes: Sizes) -> dict[str, Any]:
    timings: dict[str, float] = {}
    r = client(url)
    try:
        server: dict[str, Any] = await r.info("server")
    finally:
        await r.aclose()

    began = time.perf_counter()
    rows, profile = await replaystore_rows(url, sizes)
    timings["replaystore_micro"] = time.perf_counter() - began

    began = time.perf_counter()
    f_rows, f_profile, f_info = await fastmcp_rows(url, sizes)
    timings["fastmcp_micro"] = time.perf_counter() - began

    began = time.perf_counter()
    memory = await run_memory(url, sizes)
    timings["memory"] = time.perf_counter() - began

    began = time.perf_counter()
    measured = await measure_targets(url, sizes)
    timings["targets"] = time.perf_counter() - began

    return {
        "meta": {
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "quick": sizes.quick,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "redis_server": server.get("redis_version"),
            "packages": {
                name: _version(name)
                for name in (
                    "replaystore",
                    "redis",
                    "hiredis",
                    "fastmcp",
                    "py-key-value-aio",
                    "mcp",
                    "msgpack",
                )
            },
            "sizes": asdict(sizes),
            "section_seconds": {k: round(v, 1) for k, v in timings.items()},
            "caveat": "2-core loopback machine shared by client and server: "
            "ratios within one run, not promises",
        },
        "speed": [row.as_dict() for row in (*rows, *f_rows)],
        "inner_commands_per_call": {**profile, **f_profile},
        "fastmcp_setup": f_info,
        "memory": memory,
        "targets": {"summary": target_summary(measured), "measured": measured},
    }


def run_all(
    quick: bool = False, json_path: str | Path | None = DEFAULT_JSON, *, echo: bool = True
) -> dict[str, Any]:
    """Start a Redis, run every benchmark, stop it; return (and optionally write) the results."""
    sizes = QUICK if quick else FULL
    began = time.perf_counter()
    with redis_server() as handle, settled_heap():
        results = asyncio.run(_run(handle.url, sizes))
    results["meta"]["total_seconds"] = round(time.perf_counter() - began, 1)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n")
    if echo:
        print(render(results))
        if json_path is not None:
            print(f"\nJSON written to {json_path}")
    return results


# -- tables -----------------------------------------------------------------


def _us(value: float) -> str:
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def _speed_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'subject':<46} {'time':>9}  {'baseline':<32} {'time':>9} {'ratio':>7}  per-round",
        "-" * 126,
    ]
    group = None
    for row in rows:
        if group is not None and row["group"] != group:
            lines.append("")
        group = row["group"]
        spread = f"{row['ratio_min']:.2f}-{row['ratio_max']:.2f}"
        lines.append(
            f"{row['subject']:<46} {_us(row['subject_us']):>9}  {row['baseline']:<32} "
            f"{_us(row['baseline_us']):>9} {row['ratio']:>6.2f}x  {spread}"
        )
    return lines


def _memory_table(memory: dict[str, Any]) -> list[str]:
    rs, bare, fm = memory["replaystore"], memory["bare_stream"], memory["fastmcp"]
    n, seqs = memory["events"], memory["sequences"]
    rs_label = f"replaystore, {n} events, {seqs} sequences"
    fm_label = f"FastMCP EventStore, {fm['events']} events, one stream"
    lines = [
        f"{'what':<52} {'bytes/event':>11} {'x payload':>9} {'x bare':>7}",
        "-" * 82,
        f"{rs_label:<52} "
        f"{rs['bytes_per_event']:>11.1f} {rs['ratio_to_payload']:>9.2f} "
        f"{rs['ratio_to_bare_stream']:>7.2f}",
    ]
    for role, k in rs["keys"].items():
        per = rs["per_key_bytes_per_event"][role]
        label = f"  {role} ({k['type']}, {k['encoding']}, {k['bytes']} B)"
        lines.append(f"{label:<52} {per:>11.1f}")
    lines.append(
        f"{'bare stream, same payloads, one field (baseline)':<52} "
        f"{bare['bytes_per_event']:>11.1f} {bare['ratio_to_payload']:>9.2f} {1:>7.2f}"
    )
    lines.append(
        f"{fm_label:<52} "
        f"{fm['bytes_per_event']:>11.1f} {fm['ratio_to_payload']:>9.2f} "
        f"{fm['ratio_to_bare_stream']:>7.2f}"
    )
    return lines


def _profile_table(profile: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"{'call':<44} {'server':>9} {'commands':>8}  breakdown", "-" * 110]
    for name, p in profile.items():
        shown = ", ".join(f"{k} {v:g}" for k, v in p["calls"].items())
        lines.append(
            f"{name:<44} {_us(p['server_us_per_call']):>9} {p['inner_commands']:>8g}  {shown}"
        )
    return lines


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    mode = "QUICK: sizes too small for the ratios to mean anything" if meta["quick"] else "full"
    out = [
        f"replaystore benchmarks ({mode})",
        f"redis-server {meta['redis_server']}, python {meta['python']}, {meta['cpu_count']} CPUs, "
        f"{meta['total_seconds']} s; ratios within this run, not promises",
        "",
        "Speed: median time per awaited call over the rounds; ratio = subject / baseline",
        *_speed_table(results["speed"]),
        "",
        "Redis server time and commands per call (INFO commandstats; Lua's inner commands count)",
        *_profile_table(results["inner_commands_per_call"]),
        "",
        "Memory: MEMORY USAGE ... SAMPLES 0 summed over the keys / events",
        *_memory_table(results["memory"]),
        "",
        "Cost targets (ratios to raw commands in this run; Redis CPU from INFO cpu)",
        render_targets(results["targets"]["measured"]),
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"where to write JSON ({DEFAULT_JSON})"
    )
    args = parser.parse_args(argv)
    run_all(quick=args.quick, json_path=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the opt-in durability option costs: an append that waits for a replica's acknowledgement.

    python -m benchmarks.durability [--quick] [--json out.json]

Starts its own primary and replica (``replaystore.testing.start_replicated_pair``,
replica linked straight to the primary, both on loopback) and times, in
alternating rounds of one run, the same appends through two buffers on the
primary: one with the durability option (``WAIT`` for one replica after each
append) and one without. The ratio is the price of knowing that an
acknowledged event survives a failover; on loopback it is mostly one more
round trip between the two servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from replaystore import ReplayBuffer, UnsupportedURLError
from replaystore.testing import redis_server_binary, start_replicated_pair

from .common import FULL, QUICK, Row, Sizes, paired, payload, settled_heap

DURABLE: dict[str, Any] = {"wait_replicas": 1, "wait_timeout": 1.0}
"""The option under test: an append returns once one replica acknowledged it (1 s at most)."""

_BIG = 10**7  # retention far above what is written: no eviction on these paths


async def run_durability(url: str, sizes: Sizes) -> list[Row]:
    """Paired rows: durable append (and batch of 16) against the plain one, same primary."""
    payloads = [payload(i) for i in range(256)]
    async with AsyncExitStack() as stack:
        plain = await stack.enter_async_context(
            ReplayBuffer.from_url(url, prefix="bench-plain:", max_events=_BIG)
        )
        try:
            durable = await stack.enter_async_context(
                ReplayBuffer.from_url(url, prefix="bench-durable:", max_events=_BIG, **DURABLE)
            )
        except (TypeError, UnsupportedURLError) as exc:
            raise SystemExit(f"the durability option {DURABLE} is not available: {exc}") from exc
        for buf in (plain, durable):
            await buf.open_session("s")

        async def append_plain(i: int) -> object:
            return await plain.append("s", "q", payloads[i % 256])

        async def append_durable(i: int) -> object:
            return await durable.append("s", "q", payloads[i % 256])

        async def batch_plain(i: int) -> object:
            return await plain.append_many("s", "q", payloads[i % 16 : i % 16 + 16])

        async def batch_durable(i: int) -> object:
            return await durable.append_many("s", "q", payloads[i % 16 : i % 16 + 16])

        with settled_heap():
            return [
                await paired(
                    "append.durable",
                    "durability",
                    ("append, waiting for 1 replica", append_durable),
                    ("append", append_plain),
                    ops=sizes.append_ops,
                    sizes=sizes,
                ),
                await paired(
                    "append_many16.durable",
                    "durability",
                    ("append_many(16), waiting for 1 replica", batch_durable),
                    ("append_many(16)", batch_plain),
                    ops=sizes.batch_ops,
                    sizes=sizes,
                ),
            ]


def render(rows: list[Row]) -> str:
    lines = [
        "| row | subject | baseline | subject µs | baseline µs | ratio (min-max) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.id} | {r.subject} | {r.baseline} | {r.subject_us:.0f} | {r.baseline_us:.0f} "
            f"| {r.ratio:.2f} ({r.ratio_min:.2f}-{r.ratio_max:.2f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (ratios are noise)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    with start_replicated_pair(redis_server_binary(), direct=True) as pair:
        rows = asyncio.run(run_durability(pair.primary.url, sizes))
    print(render(rows))
    if args.json:
        report = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {platform.python_version()}",
            "option": DURABLE,
            "rows": [r.as_dict() for r in rows],
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

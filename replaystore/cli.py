"""The ``replaystore`` command: the demo, the example MCP server, and operator probes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import anyio

from .buffer import ReplayBuffer
from .errors import ReplayStoreError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replaystore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="play the seed's reconnect scenario and print each verdict")
    demo.add_argument("--url", default="memory://", help="backend URL (default: memory://)")

    server = sub.add_parser("example-server", help="serve the example MCP server over HTTP")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--url", default="memory://", help="backend URL (default: memory://)")
    server.add_argument("--max-events", type=int, default=10_000)

    inspect = sub.add_parser("inspect", help="print a session's floor and high-water marks")
    inspect.add_argument("session")
    inspect.add_argument("--url", required=True)

    probe = sub.add_parser("probe", help="the verdict a cursor would get (no replay, no teardown)")
    probe.add_argument("session")
    probe.add_argument("last_event_id")
    probe.add_argument("--sequence")
    probe.add_argument("--url", required=True)
    return parser


async def _inspect(url: str, session: str) -> int:
    async with ReplayBuffer.from_url(url) as buf:
        info = await buf.session_info(session)
    if info is None:
        print(json.dumps({"session": session, "exists": False}))
        return 1
    sequences = {
        name: {"floor": s.floor, "high_water": s.high_water, "retained": s.retained}
        for name, s in info.sequences.items()
    }
    body = {
        "session": info.session,
        "epoch": info.epoch,
        "floor": info.floor,
        "high_water": info.high_water,
        "retained": info.retained,
        "sequences": sequences,
    }
    print(json.dumps(body, indent=2))
    return 0


async def _probe(url: str, session: str, cursor: str, sequence: str | None) -> int:
    async with ReplayBuffer.from_url(url) as buf:
        res = await buf.resolve(session, cursor, sequence)
    print(json.dumps({"verdict": res.verdict.value, "evidence": res.evidence.as_dict()}, indent=2))
    return 0 if res.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from .demo import run_demo

            return 1 if anyio.run(run_demo, args.url) else 0
        if args.command == "example-server":
            from .mcp.example import serve

            serve(args.host, args.port, url=args.url, max_events=args.max_events)
            return 0
        if args.command == "inspect":
            return anyio.run(_inspect, args.url, args.session)
        return anyio.run(_probe, args.url, args.session, args.last_event_id, args.sequence)
    except ReplayStoreError as exc:
        print(f"replaystore: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

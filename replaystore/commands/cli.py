"""The replaystore command line: a demo, an example MCP server, and operator probes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio

from .. import __version__
from ..backends.coordination import coordination_of
from ..backends.session_registry import holders
from ..buffer import ReplayBuffer
from ..cursor import Cursor
from .ending import one_line, run_command

_DESCRIPTION = (
    "Replay buffers for server-sent events that resume exactly or say why they cannot. "
    "Operator commands print JSON; every error is one line on stderr and a non-zero exit."
)
_URL_HELP = "store URL: memory://, redis://host:port/db[?prefix=...], redis+cluster://..."


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replaystore", description=_DESCRIPTION)
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="play seven scripted reconnects of one session and print each verdict",
        description="Play seven scripted reconnects of one session against the store (its own "
        "cursor, an evicted one, another stream's, a bare position, one ahead, one of an "
        "earlier incarnation): each gets its verdict, next to what a naive store would have "
        "answered. On Redis the demo deletes its keys when it ends.",
    )
    demo.add_argument("--url", default="memory://", help=f"{_URL_HELP} (default: memory://)")

    # Listed here for --help only: main() hands "example-server ..." to the example
    # server's own parser (replaystore.mcp.example, where its options live).
    sub.add_parser(
        "example-server",
        help="serve the example MCP server over streamable HTTP "
        "(replaystore example-server --help)",
        add_help=False,
    )

    inspect = sub.add_parser(
        "inspect",
        help="print a session's floor and high-water marks, record and TTLs, or why it ended",
        description="Print a session's floor, high-water and retained count, per sequence too; "
        "for an MCP session its record (protocol revision, the replicas serving it) and age; "
        "and the seconds each of its keys has left in the store. "
        "For a session that no longer exists, print its tombstone (why and when it ended) while "
        "the store keeps it. Exit status 1 when the session does not exist.",
    )
    inspect.add_argument("session", help="the session id (for MCP: the Mcp-Session-Id)")
    inspect.add_argument("--url", required=True, help=_URL_HELP)

    probe = sub.add_parser(
        "probe",
        help="the verdict a cursor would get, and how many events a resume would replay",
        description="Print the verdict a resume from LAST_EVENT_ID would get, its evidence, and "
        "how many events it would replay. Never tears the session down; counting the events "
        "reads them like a successful resume, which also keeps the session alive. Exit status "
        "1 for any verdict but resumed.",
    )
    probe.add_argument("session", help="the session id (for MCP: the Mcp-Session-Id)")
    probe.add_argument("last_event_id", help="the cursor a client would send as Last-Event-ID")
    probe.add_argument(
        "--sequence",
        help="the stream being resumed (for MCP: a request id or _GET_stream); "
        "default: the stream of the cursor's event",
    )
    probe.add_argument("--url", required=True, help=_URL_HELP)

    # Listed here for --help only: main() hands "bench ..." to its own parser.
    sub.add_parser(
        "bench",
        help="benchmarks against the stores people use (replaystore bench storm --help)",
        add_help=False,
    )
    return parser


async def _inspect(url: str, session: str) -> int:
    async with ReplayBuffer.from_url(url) as buf:
        info = await buf.session_info(session)
        # For a session that is gone, a probe's unknown_session evidence carries
        # the tombstone; resolve has no side effects and "0" is never judged.
        gone = await buf.resolve(session, "0") if info is None else None
        record, expiries = await _beside(buf, session)
    if info is None:
        body: dict[str, Any] = {"session": session, "exists": False}
        if gone is not None and gone.evidence.tombstone is not None:
            body["tombstone"] = gone.evidence.as_dict()["tombstone"]
        body.update(_stored(record, expiries))
        print(json.dumps(body, indent=2))
        return 1
    sequences = {
        name: {"floor": s.floor, "high_water": s.high_water, "retained": s.retained}
        for name, s in info.sequences.items()
    }
    body = {
        "session": info.session,
        "exists": True,
        "epoch": info.epoch,
        "floor": info.floor,
        "high_water": info.high_water,
        "retained": info.retained,
        "sequences": sequences,
        **_stored(record, expiries),
    }
    print(json.dumps(body, indent=2))
    return 0


async def _beside(
    buf: ReplayBuffer, session: str
) -> tuple[dict[str, str] | None, dict[str, float | None]]:
    """The session record MCP replicas keep, and each key's seconds left (a store with keys)."""
    try:
        coordination = coordination_of(buf.backend)
    except TypeError:  # a backend serving no MCP replicas keeps no record
        return None, {}
    record = await coordination.registry().get_session(session)
    expiries = getattr(coordination, "expiries", None)  # a store with keys that expire
    return record, (await expiries(session) if expiries is not None else {})


def _stored(record: dict[str, str] | None, expiries: dict[str, float | None]) -> dict[str, Any]:
    """What MCP replicas keep beside the events: the session record, its age, each key's TTL.

    The record (written when ``initialize`` was answered) names the protocol
    revision, the replicas serving the session (``held:<replica>``) and the
    GET stream's first event, whose id carries when the session began.
    """
    body: dict[str, Any] = {}
    if record is not None:
        body["record"] = {
            "revision": record.get("version"),
            "serving_replicas": sorted(holders(record)),
            "fields": dict(sorted(record.items())),
        }
        began = _stamp(record.get("get", ""))
        if began is not None:
            body["age_seconds"] = round(time.time() - began / 1000, 3)
    if expiries:
        body["ttl_seconds"] = {
            key: None if left is None else round(left, 3) for key, left in expiries.items()
        }
    return body


def _stamp(event_id: str) -> int | None:
    """When an event was stored (ms, the store's clock), from its id; None when it has none."""
    try:
        stamp = Cursor.parse(event_id).stamp
    except ValueError:
        return None
    return stamp if stamp else None


async def _probe(url: str, session: str, cursor: str, sequence: str | None) -> int:
    async with ReplayBuffer.from_url(url) as buf:
        res = await buf.resolve(session, cursor, sequence)
        would_replay: int | None = None
        if res.ok:
            # Count by replaying through a buffer that never tears down: the
            # verdict above came from a call without side effects, this one only
            # reads (and refreshes the session's TTL, as a successful resume does).
            counting = ReplayBuffer(buf.backend, teardown_on_failure=False)
            replay = await counting.resolve_and_replay(session, cursor, sequence)
            would_replay = len(replay.events) if replay.ok else None
    evidence = res.evidence.as_dict()
    # A probe replays nothing: its "replayed" would read 0 beside would_replay.
    evidence.pop("replayed", None)
    body = {"verdict": res.verdict.value, "would_replay": would_replay, "evidence": evidence}
    print(json.dumps(body, indent=2))
    return 0 if res.ok else 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from .demo import run_demo

        return 1 if anyio.run(run_demo, args.url) else 0
    if args.command == "inspect":
        return anyio.run(_inspect, args.url, args.session)
    return anyio.run(_probe, args.url, args.session, args.last_event_id, args.sequence)


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["bench"]:  # benchmarks have their own parser: replaystore bench --help
        from ..bench import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["example-server"]:  # the example server's own parser and main
        try:
            from ..mcp.example import main as example_main
        except ModuleNotFoundError as exc:  # the MCP extra is optional
            if (exc.name or "").startswith("replaystore"):
                raise
            need = "example-server needs the MCP extra (pip install 'replaystore[mcp]')"
            print(f"replaystore: {one_line(f'{need}: {exc}')}", file=sys.stderr)
            return 2
        return example_main(argv[1:], prog="replaystore example-server")
    return _run(_parser().parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """``replaystore COMMAND ...``: a status, and every error one line on stderr."""
    args = sys.argv[1:] if argv is None else list(argv)
    return run_command(lambda: _dispatch(args))


if __name__ == "__main__":
    sys.exit(main())

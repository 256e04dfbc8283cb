"""The replaystore command line: a demo, an example MCP server, and operator probes."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from . import __version__
from .buffer import ReplayBuffer
from .errors import ReplayStoreError, StorageError

_DESCRIPTION = (
    "Replay buffers for server-sent events that resume exactly or say why they cannot. "
    "Operator commands print JSON; every error is one line on stderr and a non-zero exit."
)
_URL_HELP = "store URL: memory://, redis://host:port/db[?prefix=...], redis+cluster://..."
_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_TRACE = 5  # uvicorn's level below DEBUG
_MAX_LOG_RECORD = 2000
_MAX_ERROR = 300


def _port(text: str) -> int:
    """A TCP port to listen on; 0 lets the system choose one."""
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0 to 65535)")
    return port


def _positive_int(text: str) -> int:
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _seconds(text: str) -> float:
    """A positive, finite duration: ``nan`` would start a server that fails every request."""
    seconds = float(text)
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return seconds


def _task_ttl(text: str) -> float:
    """A task TTL: a positive duration of at most 366 days."""
    seconds = _seconds(text)
    if seconds > 366 * 86400:
        raise argparse.ArgumentTypeError(f"must be at most 366 days (31622400 s), not {text!r}")
    return seconds


# argparse names the type in its error ("invalid _port value: 'x'"): name them for a person.
_port.__name__ = "port"
_positive_int.__name__ = "positive integer"
_seconds.__name__ = "duration"
_task_ttl.__name__ = "task TTL"


def _add_operations_options(parser: argparse.ArgumentParser) -> None:
    """The options of a replica behind a balancer (both ``example-server`` command lines).

    The defaults are ``DRAIN_SECONDS`` and ``PING_SECONDS`` of
    :mod:`replaystore.mcp.example` (not imported here: the MCP extra is optional).
    """
    parser.add_argument(
        "--drain-seconds",
        type=_seconds,
        default=10.0,
        help="on SIGTERM, how long running requests and tasks may finish while no new work "
        "is taken; "
        "what still runs then is handed over (default: %(default)s)",
    )
    parser.add_argument(
        "--ping-seconds",
        type=_seconds,
        default=15.0,
        help="keep-alive interval of idle SSE streams; a balancer's read timeout must be "
        "longer (default: %(default)s)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST[:PORT|:*]",
        help="a Host header a balancer passes through (repeatable): keeps the SDK's "
        "DNS-rebinding protection on for it",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replaystore", description=_DESCRIPTION)
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="play a reconnect storm against the store and print each verdict",
        description="Play a reconnect storm against the store: each reconnect attempt gets its "
        "verdict, next to what a naive store would have answered. On Redis the demo deletes "
        "its keys when it ends.",
    )
    demo.add_argument("--url", default="memory://", help=f"{_URL_HELP} (default: memory://)")

    server = sub.add_parser(
        "example-server",
        help="serve the example MCP server over streamable HTTP",
        description="Serve an example MCP server at /mcp (streamable HTTP, resumable), with "
        "Prometheus metrics at /metrics (with prometheus_client installed: "
        "pip install 'replaystore[prometheus]'). Processes on one store URL are replicas of each "
        "other: any of them serves any session.",
    )
    server.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    server.add_argument(
        "--port", type=_port, default=8000, help="port to listen on (default: %(default)s)"
    )
    server.add_argument("--url", default="memory://", help=f"{_URL_HELP} (default: memory://)")
    server.add_argument(
        "--max-events",
        type=_positive_int,
        default=10_000,
        help="events kept per session before the oldest is evicted (default: %(default)s)",
    )
    server.add_argument(
        "--log-level",
        default="warning",
        choices=_LOG_LEVELS,
        help="server log level (default: %(default)s)",
    )
    server.add_argument(
        "--lease-seconds",
        type=_seconds,
        default=5.0,
        help="how long a request's lease lasts unrenewed: a client whose request's replica "
        "stopped gets an error after about this long (default: %(default)s)",
    )
    server.add_argument(
        "--max-payload",
        type=_positive_int,
        default=8 << 20,
        help="largest message stored, in bytes; a larger result is answered with an error "
        "(default: %(default)s)",
    )
    server.add_argument(
        "--task-ttl",
        type=_task_ttl,
        default=3600.0,
        help="how long a task of a 2026-07-28 client (and its result) is kept after its "
        "creation, in seconds (default: %(default)s)",
    )
    _add_operations_options(server)

    inspect = sub.add_parser(
        "inspect",
        help="print a session's floor and high-water marks, or why it ended",
        description="Print a session's floor, high-water and retained count, per sequence too. "
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
    if info is None:
        body: dict[str, Any] = {"session": session, "exists": False}
        if gone is not None and gone.evidence.tombstone is not None:
            body["tombstone"] = gone.evidence.as_dict()["tombstone"]
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
    }
    print(json.dumps(body, indent=2))
    return 0


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


async def _check_store(url: str) -> None:
    """Check the store once before serving: what it refuses is one line, not a traceback.

    An unreachable store, or one whose ACL forbids what a replica needs,
    stops the command (exit status 2); a store that refuses writes for now
    (out of memory, read-only) and an eviction policy that may end sessions
    are one warning line each.
    """
    from .mcp.preflight import check_store

    async with ReplayBuffer.from_url(url) as buffer:
        problems = await check_store(buffer)
    for problem in problems:
        if problem.fatal:
            raise StorageError(problem.text, kind="noperm", permanent=True)
        logging.getLogger("replaystore").warning("%s", problem.text)


def _say_if_metrics_are_off() -> None:
    """/metrics exists only with prometheus_client: say so at start, not with a bare 404 later."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        logging.getLogger("replaystore").warning(
            "no metrics at /metrics: prometheus_client is not installed "
            "(pip install 'replaystore[prometheus]')"
        )


class _BoundedFormatter(logging.Formatter):
    """One line per record, at most ``limit`` characters, whatever a peer put in it.

    Log records quote what clients send (tool names, ids, cursors); a 2 MB
    tool name must not become megabytes of log.
    """

    def __init__(self, limit: int = _MAX_LOG_RECORD) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.limit = limit

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).replace("\n", "\n    ")
        if len(text) > self.limit:
            text = f"{text[: self.limit]}... ({len(text)} characters)"
        return text


def _configure_logging(level: str) -> None:
    """The server's log: the requested level for every logger, bounded records on stderr.

    Configured before the MCP server is built, so the SDK's own logging setup
    (which only applies to an unconfigured process) leaves it alone.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_BoundedFormatter())
    logging.basicConfig(level=_TRACE if level == "trace" else level.upper(), handlers=[handler])


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from .demo import run_demo

        return 1 if anyio.run(run_demo, args.url) else 0
    if args.command == "example-server":
        from .mcp.example import serve

        _configure_logging(args.log_level)
        anyio.run(_check_store, args.url)
        _say_if_metrics_are_off()
        serve(
            args.host,
            args.port,
            url=args.url,
            max_events=args.max_events,
            log_level=args.log_level,
            lease_ttl=args.lease_seconds,
            max_payload=args.max_payload,
            task_ttl=args.task_ttl,
            drain_seconds=args.drain_seconds,
            ping_seconds=args.ping_seconds,
            allowed_hosts=args.allowed_host,
            check_store=False,  # checked above
        )
        return 0
    if args.command == "inspect":
        return anyio.run(_inspect, args.url, args.session)
    return anyio.run(_probe, args.url, args.session, args.last_event_id, args.sequence)


def _one_line(text: str, limit: int = _MAX_ERROR) -> str:
    """An error as one line a person reads: no newlines, and the gist of a driver's repr."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["bench"]:  # benchmarks have their own parser: replaystore bench --help
            from .bench import main as bench_main

            return bench_main(argv[1:])
        return _run(_parser().parse_args(argv))
    except ReplayStoreError as exc:
        print(f"replaystore: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (``replaystore demo | head``): stop quietly,
        # with the status of a command ended by SIGPIPE.
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

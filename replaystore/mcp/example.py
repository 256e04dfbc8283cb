"""A runnable MCP server that exercises resumption: ``replaystore example-server``.

The same command runs as ``python -m replaystore.mcp.example``: one option
parser, one set of defaults, one :func:`main` for both command lines.

Built with the official SDK's ``MCPServer``, served at ``/mcp`` (streamable
HTTP, resumable through a :class:`~replaystore.ReplayBuffer`) with a short
``retry`` interval (100 ms) so that clients come back quickly, and Prometheus
metrics at ``/metrics`` when ``prometheus_client`` is installed. Tools:

- ``countdown(n, interval_ms=10, close_after=0)``: ``n`` progress
  notifications for the call (when the client sent a progress token), then
  ``"done {n}"``. With ``close_after > 0`` the server closes the SSE
  connection after that many notifications, so the client has to resume with
  ``Last-Event-ID`` to get the rest.
- ``broadcast(n)``: ``n`` log messages on the standalone GET stream (tied to
  no request), then ``"sent {n}"``.
- ``ask(question)``: asks the client for a name (elicitation) and answers
  ``"hello {name}"`` (or ``"no answer ({action})"``). On a 2025-11-25
  session the client's answer may reach any replica: it is forwarded to the
  one running the call. A 2026-07-28 client without the tasks extension
  gets an ``InputRequiredResult`` and sends the call again with its answer,
  to any replica.

For a 2026-07-28 client that declares the ``io.modelcontextprotocol/tasks``
extension, ``countdown`` and ``ask`` run as durable tasks (kept
``--task-ttl`` seconds): ``ask``'s elicitation becomes an input request, and
``countdown`` emits one task event per step instead of a progress
notification (type ``com.example/countdown``, payload ``{"step", "left"}``),
which any replica streams (``tasks/stream``); each task keeps its last
``--task-events`` events. A replica serves at most ``--task-streams``
streams at once, at most ``--task-client-streams`` of one task per client.

Any number of these servers on one Redis URL are replicas of each other.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import anyio
from mcp.server.elicitation import AcceptedElicitation
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel
from starlette.applications import Starlette

from ..backends.coordination import coordination_of
from ..buffer import ReplayBuffer
from ..commands.ending import run_command
from ..errors import StorageError
from ..taskstore import EventRetention
from . import preflight
from .app import streamable_http_app
from .http_head import http_protocol
from .metrics import ResumptionObserver
from .sessions.health import HEALTH_PATH
from .settings import DEFAULT_DRAIN_SECONDS, DEFAULT_LEASE_TTL
from .subscriptions import StoreSubscriptionBus
from .tasks import emit_event
from .tasks.extension import ReplayTasks, TaskSupport
from .tasks.stream import DEFAULT_CLIENT_STREAMS, DEFAULT_STREAMS

__all__ = ["build_app", "build_server", "configure_logging", "main", "parser", "serve"]

#: Milliseconds a client waits before reconnecting (sent in every priming event).
RETRY_INTERVAL_MS = 100

#: Largest message stored (bytes): well above ordinary tool results (the SDK
#: accepts request bodies up to 4 MiB, and an error may echo one back).
DEFAULT_MAX_PAYLOAD = 8 << 20

#: Seconds between two keep-alive comments on an idle SSE stream: a balancer's
#: read timeout must be above it (sse-starlette's default, 15 s, made explicit).
PING_SECONDS = 15.0

#: Seconds a task is kept after its creation, by default.
DEFAULT_TASK_TTL = 3600.0

#: Where the server listens and what it stores in, by default: loopback and an
#: in-process store, so that nothing is exposed or shared unless asked.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_URL = "memory://"

#: Events kept per session before the oldest is evicted, by default.
DEFAULT_MAX_EVENTS = 10_000

#: Events kept per task (``tasks/stream``) before the oldest is dropped, by default.
DEFAULT_TASK_EVENTS = EventRetention().max_events

#: The log levels a server accepts (uvicorn's names; ``trace`` is below ``debug``).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
DEFAULT_LOG_LEVEL = "warning"


def build_server(
    tasks: ReplayTasks | None = None, subscriptions: StoreSubscriptionBus | None = None
) -> MCPServer:
    """The MCP server with its tools, transport-agnostic (with the tasks extension if given)."""
    server = MCPServer(
        "replaystore-example", extensions=[tasks] if tasks else None, subscriptions=subscriptions
    )

    @server.tool()
    async def countdown(ctx: Context, n: int, interval_ms: int = 10, close_after: int = 0) -> str:
        """Count n steps, then finish: a progress notification each (closing the stream after
        close_after), or in a task, a task event each."""
        for i in range(n):
            step = {"step": i + 1, "left": n - i - 1}
            if await emit_event(ctx, "com.example/countdown", step) is None:  # not a task
                await ctx.report_progress(i + 1, n, f"{n - i - 1} left")
            if close_after and i + 1 == close_after:
                await ctx.close_sse_stream()
            if interval_ms > 0:
                await anyio.sleep(interval_ms / 1000)
        return f"done {n}"

    @server.tool()
    async def broadcast(ctx: Context, n: int) -> str:
        """Send n log messages on the standalone GET stream (tied to no request)."""
        for i in range(n):
            await ctx.session.send_log_message("info", f"broadcast {i + 1}/{n}")
        return f"sent {n}"

    @server.tool()
    async def ask(ctx: Context, question: str = "What is your name?") -> str | InputRequiredResult:
        """Ask the client for a name (elicitation), then greet it."""
        answers = ctx.input_responses or {}
        if ASK_KEY in answers:  # the retried request of a multi-round call, on any replica
            return _greeting(answers[ASK_KEY])
        in_task = tasks is not None and tasks.declared(ctx.request_context)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and not in_task:
            # 2026-07-28 has no channel for a server's request outside a task:
            # the client answers and sends the call again.
            return InputRequiredResult(input_requests={ASK_KEY: _name_request(question)})
        answer = await ctx.elicit(question, _Name)
        if isinstance(answer, AcceptedElicitation):
            return f"hello {answer.data.name}"
        return f"no answer ({answer.action})"

    return server


class _Name(BaseModel):
    name: str


#: The key of ``ask``'s question in an ``InputRequiredResult`` (2026-07-28).
ASK_KEY = "name"


def _name_request(question: str) -> ElicitRequest:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    return ElicitRequest(params=ElicitRequestFormParams(message=question, requested_schema=schema))


def _greeting(answer: object) -> str:
    if isinstance(answer, ElicitResult) and answer.action == "accept" and answer.content:
        return f"hello {answer.content.get('name')}"
    action = answer.action if isinstance(answer, ElicitResult) else "invalid"
    return f"no answer ({action})"


def build_app(
    url: str = DEFAULT_URL,
    max_events: int = DEFAULT_MAX_EVENTS,
    *,
    host: str = DEFAULT_HOST,
    observer: ResumptionObserver | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    task_ttl: float = DEFAULT_TASK_TTL,
    task_events: int = DEFAULT_TASK_EVENTS,
    task_streams: int = DEFAULT_STREAMS,
    task_client_streams: int = DEFAULT_CLIENT_STREAMS,
    allowed_hosts: Sequence[str] = (),
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
    check_store: bool = True,
    **buffer_options: Any,
) -> Starlette:
    """The ASGI app: MCP at ``/mcp``, the health check at ``/healthz``, metrics at ``/metrics``.

    (Metrics if prometheus_client is there.) Built by
    :func:`~replaystore.mcp.streamable_http_app` as any app of yours, so it
    drains when its server stops, for ``drain_seconds``, and checks the
    store at start unless ``check_store`` is false. The buffer is closed
    when the app's lifespan ends. ``max_payload`` (bytes,
    :data:`DEFAULT_MAX_PAYLOAD` here) and the other buffer options go to
    :meth:`ReplayBuffer.from_url`. ``allowed_hosts`` (``Host`` header
    values, ``name:*`` for any port) keeps the SDK's DNS-rebinding
    protection on for names a balancer passes through.
    """
    buffer_options.setdefault("max_payload", DEFAULT_MAX_PAYLOAD)
    tasks = example_tasks(task_ttl, lease_ttl, task_events, task_streams, task_client_streams)
    server = build_server(tasks)
    buffer = ReplayBuffer.from_url(url, max_events=max_events, **buffer_options)
    app = streamable_http_app(
        server,
        buffer,
        observer=observer,
        retry_interval=RETRY_INTERVAL_MS,
        host=host,
        lease_ttl=lease_ttl,
        tasks=tasks,
        close_buffer=True,
        drain_seconds=drain_seconds,
        check_store=check_store,
        metrics_path="/metrics" if _has_prometheus() else None,
        **_transport_security(allowed_hosts),
    )
    return app


def _has_prometheus() -> bool:
    return importlib.util.find_spec("prometheus_client") is not None


def _transport_security(allowed_hosts: Sequence[str]) -> dict[str, Any]:
    """The SDK's DNS-rebinding protection, allowing ``allowed_hosts`` beside loopback names."""
    if not allowed_hosts:
        return {}
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*", *allowed_hosts]
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    settings = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )
    return {"transport_security": settings}


class _HealthChecksUnlogged(logging.Filter):
    """Keep a balancer's health checks (one every few seconds) out of the access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) > 2 and args[2] == HEALTH_PATH)


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    url: str = DEFAULT_URL,
    max_events: int = DEFAULT_MAX_EVENTS,
    *,
    log_level: str = DEFAULT_LOG_LEVEL,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    task_ttl: float = DEFAULT_TASK_TTL,
    task_events: int = DEFAULT_TASK_EVENTS,
    task_streams: int = DEFAULT_STREAMS,
    task_client_streams: int = DEFAULT_CLIENT_STREAMS,
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
    ping_seconds: float = PING_SECONDS,
    allowed_hosts: Sequence[str] = (),
    check_store: bool = True,
) -> None:
    """Serve :func:`build_app` with uvicorn until ``SIGTERM`` (or Ctrl-C), then drain.

    Plain uvicorn: the app drains by itself when uvicorn is told to stop
    (:mod:`replaystore.mcp.stopping`), as any app built by
    :func:`~replaystore.mcp.streamable_http_app` does. ``check_store``:
    check once, at start-up, what the store must give a replica
    (:meth:`ReplaySessionManager.check_store`), logging each problem in one
    line; ``False`` when the caller did.

    On the signal the replica stops taking work (its health check answers
    503 ``draining``, new requests 503 with ``Retry-After``, uvicorn stops
    accepting connections), lets running requests finish for up to
    ``drain_seconds``, then stops: requests still running are handed over
    (their leases dropped, so another replica answers them as lost at once).
    Tasks likewise: no new ones (503), running ones go on for up to
    ``drain_seconds``, then an idempotent tool's task is released for another
    replica to run again at once, and any other ends ``failed`` saying so.
    """
    import uvicorn
    from sse_starlette import EventSourceResponse

    # broadcast() uses notifications/message on purpose (a standalone stream
    # message); the SDK flags the logging capability as deprecated for 2026-07-28.
    warnings.filterwarnings("ignore", message="The logging capability is deprecated")
    logging.getLogger("uvicorn.access").addFilter(_HealthChecksUnlogged())
    # Every SSE stream of this process (the SDK's and ours) pings this often.
    EventSourceResponse.DEFAULT_PING_INTERVAL = ping_seconds  # type: ignore[assignment]

    app = build_app(
        url,
        max_events,
        host=host,
        lease_ttl=lease_ttl,
        max_payload=max_payload,
        task_ttl=task_ttl,
        task_events=task_events,
        task_streams=task_streams,
        task_client_streams=task_client_streams,
        allowed_hosts=allowed_hosts,
        drain_seconds=drain_seconds,
        check_store=check_store,
    )

    class AnnouncingServer(uvicorn.Server):
        """uvicorn's server, saying where it listens once it does (the system may pick the port)."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            _say_where(self.servers)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=http_protocol())
    AnnouncingServer(config).run()


def example_tasks(
    ttl: float = DEFAULT_TASK_TTL,
    lease: float = DEFAULT_LEASE_TTL,
    events: int = DEFAULT_TASK_EVENTS,
    streams: int = DEFAULT_STREAMS,
    client_streams: int = DEFAULT_CLIENT_STREAMS,
) -> ReplayTasks:
    """``countdown`` and ``ask`` as tasks for clients that declare the extension.

    ``countdown`` is idempotent: if its replica dies, a survivor counts again
    (its events go on after the last one stored). Each task keeps its last
    ``events`` events; the replica serves at most ``streams`` task event
    streams at once, ``client_streams`` of one task per client.
    """
    return ReplayTasks(
        {"countdown": TaskSupport("optional", idempotent=True), "ask": "optional"},
        ttl=ttl,
        lease=lease,
        events=EventRetention(max_events=events),
        check_interval=min(0.25, lease / 4),
        poll_interval=0.5,
        max_streams=streams,
        max_client_streams=client_streams,
    )


# ------------------------------------------------------------- command line
#
# One parser and one main for ``replaystore example-server`` and ``python -m
# replaystore.mcp.example``: the replaystore command hands its arguments here.


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


def _task_events(text: str) -> int:
    """Events kept per task: what :class:`~replaystore.taskstore.EventRetention` accepts."""
    number = int(text)
    try:
        EventRetention(max_events=number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, not {number}") from None
    return number


# argparse names the type in its error ("invalid _port value: 'x'"): name them for a person.
_port.__name__ = "port"
_positive_int.__name__ = "positive integer"
_seconds.__name__ = "duration"
_task_ttl.__name__ = "task TTL"
_task_events.__name__ = "number of events"

_DESCRIPTION = (
    "Serve an example MCP server at /mcp (streamable HTTP, resumable), with Prometheus "
    "metrics at /metrics (with prometheus_client installed: pip install "
    "'replaystore[prometheus]'). Processes on one store URL are replicas of each other: any "
    "of them serves any session."
)
_URL_HELP = "store URL: memory://, redis://host:port/db[?prefix=...], redis+cluster://..."


def parser(prog: str = "replaystore example-server") -> argparse.ArgumentParser:
    """The example server's options, for both of its command lines (named ``prog``)."""
    options = argparse.ArgumentParser(prog=prog, description=_DESCRIPTION)
    add = options.add_argument
    add("--host", default=DEFAULT_HOST, help="address to listen on (default: %(default)s)")
    add("--port", type=_port, default=DEFAULT_PORT, help="port to listen on (default: %(default)s)")
    add("--url", default=DEFAULT_URL, help=f"{_URL_HELP} (default: %(default)s)")
    add(
        "--max-events",
        type=_positive_int,
        default=DEFAULT_MAX_EVENTS,
        help="events kept per session before the oldest is evicted (default: %(default)s)",
    )
    add(
        "--log-level",
        default=DEFAULT_LOG_LEVEL,
        choices=LOG_LEVELS,
        help="server log level (default: %(default)s)",
    )
    add(
        "--lease-seconds",
        type=_seconds,
        default=DEFAULT_LEASE_TTL,
        help="how long a request's lease lasts unrenewed: a client whose request's replica "
        "stopped gets an error after about this long (default: %(default)s)",
    )
    add(
        "--max-payload",
        type=_positive_int,
        default=DEFAULT_MAX_PAYLOAD,
        help="largest message stored, in bytes; a larger result is answered with an error "
        "(default: %(default)s)",
    )
    add(
        "--task-ttl",
        type=_task_ttl,
        default=DEFAULT_TASK_TTL,
        help="how long a task of a 2026-07-28 client (and its result) is kept after its "
        "creation, in seconds (default: %(default)s)",
    )
    add(
        "--task-events",
        type=_task_events,
        default=DEFAULT_TASK_EVENTS,
        help="events kept per task for tasks/stream; a cursor older than the oldest kept "
        "gets events_gone (default: %(default)s)",
    )
    add(
        "--task-streams",
        type=_positive_int,
        default=DEFAULT_STREAMS,
        help="tasks/stream requests this replica serves at once; one more is answered 503 "
        "with Retry-After (default: %(default)s)",
    )
    add(
        "--task-client-streams",
        type=_positive_int,
        default=DEFAULT_CLIENT_STREAMS,
        help="tasks/stream requests one client may hold open for one task on this replica; "
        "one more is refused with -32602 too_many_streams (default: %(default)s)",
    )
    add(
        "--drain-seconds",
        type=_seconds,
        default=DEFAULT_DRAIN_SECONDS,
        help="on SIGTERM, how long running requests and tasks may finish while no new work "
        "is taken; what still runs then is handed over (default: %(default)s)",
    )
    add(
        "--ping-seconds",
        type=_seconds,
        default=PING_SECONDS,
        help="keep-alive interval of idle SSE streams; a balancer's read timeout must be "
        "longer (default: %(default)s)",
    )
    add(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST[:PORT|:*]",
        help="a Host header a balancer passes through (repeatable): keeps the SDK's "
        "DNS-rebinding protection on for it",
    )
    return options


class _OneRecordFormatter(logging.Formatter):
    """A record's lines indented under its first: one record reads as one entry.

    Records are at most :data:`~replaystore.mcp.process.LOG_RECORD_LIMIT`
    characters long (message and traceback each) while the app runs: the
    wiring caps them (:mod:`replaystore.mcp.process`).
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", "\n    ")


def configure_logging(level: str) -> None:
    """The server's log: ``level`` for every logger, one entry per record, on stderr.

    Configured before the MCP server is built, so the SDK's own logging setup
    (which only applies to an unconfigured process) leaves it alone.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneRecordFormatter())
    numeric = 5 if level == "trace" else level.upper()  # uvicorn's TRACE is 5
    logging.basicConfig(level=numeric, handlers=[handler])


async def _check_store(url: str) -> None:
    """Check the store once before serving: what it refuses is one line, not a traceback.

    An unreachable store, or one whose ACL forbids what a replica needs,
    stops the command (exit status 2); a store that refuses writes for now
    (out of memory, read-only) and an eviction policy that may end sessions
    are one warning line each.
    """
    async with ReplayBuffer.from_url(url) as buffer:
        problems = await preflight.check_store(buffer, coordination_of(buffer.backend))
    for problem in problems:
        if problem.fatal:
            raise StorageError(problem.text, kind="noperm", permanent=True)
        logging.getLogger("replaystore").warning("%s", problem.text)


def _say_where(servers: Sequence[Any]) -> None:
    """One line on stderr, whatever the log level: where it listens (a port it chose too)."""
    for server in servers:
        for sock in server.sockets:
            host, port = sock.getsockname()[:2]
            base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
            extra = ", metrics at /metrics" if _has_prometheus() else ""
            print(
                f"replaystore example-server: MCP at {base}/mcp, health check at "
                f"{base}/healthz{extra}",
                file=sys.stderr,
                flush=True,
            )


def _say_if_metrics_are_off() -> None:
    """/metrics exists only with prometheus_client: say so at start, not with a bare 404 later."""
    if not _has_prometheus():
        logging.getLogger("replaystore").warning(
            "no metrics at /metrics: prometheus_client is not installed "
            "(pip install 'replaystore[prometheus]')"
        )


def main(argv: Sequence[str] | None = None, prog: str = "python -m replaystore.mcp.example") -> int:
    """Parse the options, set up the log, check the store, then :func:`serve` until stopped.

    An option out of range is an argparse error (status 2) before anything
    starts; a store that cannot serve is one line and status 2.
    """
    args = parser(prog).parse_args(argv)

    def run() -> int:
        configure_logging(args.log_level)
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
            task_events=args.task_events,
            task_streams=args.task_streams,
            task_client_streams=args.task_client_streams,
            drain_seconds=args.drain_seconds,
            ping_seconds=args.ping_seconds,
            allowed_hosts=args.allowed_host,
            check_store=False,  # checked above
        )
        return 0

    return run_command(run)


if __name__ == "__main__":
    sys.exit(main())

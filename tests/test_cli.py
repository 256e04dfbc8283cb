"""The ``replaystore`` command, run as a user runs it: real subprocesses, real Redis.

The Redis cases use the test session's own redis-server (``real_servers``);
the error cases point at a loopback port nobody listens on.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import replaystore
from replaystore import ReplayBuffer, Verdict
from replaystore.commands.cli import _parser, main
from replaystore.commands.demo import run_demo
from replaystore.testing.mcp import initialize_message
from replaystore.testing.servers import ServerHandle, find_free_port
from tests.plugins.servers import RealServers

COMMAND = [sys.executable, "-m", "replaystore"]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def redis_handle(real_servers: RealServers) -> ServerHandle:
    return real_servers.shared("redis")


def all_keys(handle: ServerHandle) -> set[bytes]:
    async def scan() -> set[bytes]:
        async with ReplayBuffer.from_url(handle.url) as buf:
            client: Any = buf.backend
            return {key async for key in client.client.scan_iter(count=1000)}

    return anyio.run(scan)


# ------------------------------------------------------------------ demo


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_demo_reaches_every_expected_verdict_on_memory(anyio_backend: str) -> None:
    lines: list[str] = []
    wrong = await run_demo("memory://", out=lines.append)
    text = "\n".join(lines)
    assert wrong == 0, text
    for verdict in (
        "resumed",
        "below_floor",
        "sequence_mismatch",
        "malformed_cursor",
        "ahead_of_high_water",
        "foreign_cursor",
    ):
        assert f"verdict : {verdict}" in text
    assert "replayed: 1 event(s): 4472:tool-7" in text
    assert "silently skips 3121..4400" in text  # the naive store's clamp, computed
    assert text.count("every replica now sees unknown_session") == 5


@pytest.mark.realserver
@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_demo_command_on_real_redis_deletes_its_keys(real_servers: RealServers, kind: str) -> None:
    handle = real_servers.shared(kind)
    before = all_keys(handle)
    out = run_cli("demo", "--url", handle.url)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "UNEXPECTED" not in out.stdout
    assert out.stdout.count("verdict : ") == 7
    assert out.stdout.count("every replica now sees unknown_session") == 5
    left = all_keys(handle) - before
    assert left == set(), f"the demo left keys behind: {sorted(left)[:10]}"


def test_demo_into_a_closed_pipe_exits_quietly() -> None:
    """``replaystore demo | head``: the reader is gone before the first line is written."""
    proc = subprocess.Popen(
        [*COMMAND, "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `head` after it has read enough
    try:
        err = proc.stderr.read().decode()
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert err == ""
    assert code == 141  # the status of a command ended by SIGPIPE


# ------------------------------------------------------------- help text


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_option_and_argument_has_help_text() -> None:
    from replaystore.bench.cli import _parser as bench_parser
    from replaystore.mcp.example import parser as example_parser

    parser = _parser()
    commands = _subparsers(parser)
    assert {"demo", "example-server", "inspect", "probe", "bench"} <= set(commands)
    bench = bench_parser()
    every = [("replaystore", parser), *commands.items(), ("bench", bench)]
    every += [("example-server", example_parser())]
    every += [(f"bench {name}", p) for name, p in _subparsers(bench).items()]
    for name, command in every:
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{name}: {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(
    "command", ["", "demo", "example-server", "inspect", "probe", "bench", "bench storm"]
)
def test_help_is_plain_text(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: replaystore")
    for markup in ("``", ":class:", ":func:", ":meth:", "\n.. "):
        assert markup not in text, f"RST markup {markup!r} in help:\n{text}"


def test_version() -> None:
    out = run_cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"replaystore {replaystore.__version__}"


# ------------------------------------------------------- unreachable store


@pytest.mark.parametrize(
    "command",
    [
        ["demo"],
        ["inspect", "S"],
        ["probe", "S", "000000000000-1"],
        ["example-server", "--port", "0"],
    ],
    ids=["demo", "inspect", "probe", "example-server"],
)
def test_unreachable_redis_is_one_line_and_a_non_zero_exit(command: list[str]) -> None:
    port = find_free_port()  # nothing listens there
    out = run_cli(*command, "--url", f"redis://127.0.0.1:{port}/0", timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("replaystore: ") and str(port) in lines[0], lines[0]
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://127.0.0.1:{port}",
        "redis+sentinel://127.0.0.1:{port}/mymaster",
        "rediss://127.0.0.1:{port}/0",
        "redis+unix:///nonexistent/redis.sock",
    ],
    ids=["cluster", "sentinel", "tls", "unix"],
)
def test_every_kind_of_unreachable_store_is_one_short_line(url: str) -> None:
    out = run_cli("inspect", "S", "--url", url.format(port=find_free_port()), timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("replaystore: "), out.stderr
    assert len(lines[0]) <= 320, lines[0]


def test_probe_and_inspect_on_an_unknown_session(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "nobody", "--url", "memory://"]) == 1
    assert json.loads(capsys.readouterr().out) == {"session": "nobody", "exists": False}
    assert main(["probe", "nobody", "junk", "--url", "memory://"]) == 1
    body = json.loads(capsys.readouterr().out)
    assert body["verdict"] == "unknown_session" and body["would_replay"] is None


def test_demo_on_an_unreachable_store_prints_only_the_error() -> None:
    out = run_cli("demo", "--url", f"redis://127.0.0.1:{find_free_port()}/0", timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stdout == "", "the demo's header came before the error"
    assert out.stderr.startswith("replaystore: ")


BAD_SERVER_OPTIONS = [
    ("--lease-seconds", "-1"),
    ("--lease-seconds", "0"),
    ("--lease-seconds", "nan"),
    ("--lease-seconds", "inf"),
    ("--port", "99999"),
    ("--port", "-1"),
    ("--max-events", "0"),
    ("--max-payload", "0"),
    ("--task-ttl", "0"),
    ("--task-ttl", "nan"),
    ("--task-ttl", "1e12"),
    ("--task-events", "0"),
    ("--task-events", "1000001"),
    ("--task-streams", "0"),
    ("--task-client-streams", "0"),
]


def _server_started(*args: object, **kwargs: object) -> None:
    raise AssertionError("the server started on a bad option")


@pytest.mark.parametrize(("option", "value"), BAD_SERVER_OPTIONS)
@pytest.mark.parametrize("command", ["example-server", "replaystore.mcp.example"])
def test_example_server_refuses_bad_options(
    option: str,
    value: str,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every bad value is an argparse error (status 2, the option named) on both command lines.

    Parsed in this process, where a value the parser let through would start a
    server: that raises instead. The command lines themselves run below.
    """
    from replaystore.mcp import example

    monkeypatch.setattr(example, "serve", _server_started)
    argv = [option, value, "--url", "memory://"]
    if command == "example-server":
        with pytest.raises(SystemExit) as exited:
            main([command, *argv])
    else:
        with pytest.raises(SystemExit) as exited:
            example.main(argv)
    assert exited.value.code == 2
    assert f"error: argument {option}: " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        (["example-server"], "--lease-seconds", "nan"),
        (["-m", "replaystore.mcp.example"], "--port", "99999"),
    ],
)
def test_example_server_refuses_bad_options_before_it_starts(
    command: list[str], option: str, value: str
) -> None:
    """As a user runs it: an argparse error (status 2, usage), not a traceback, nor a server."""
    args = [sys.executable, *command] if command[0] == "-m" else [*COMMAND, *command]
    out = subprocess.run(
        [*args, option, value, "--url", "memory://"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert f"error: argument {option}: " in out.stderr, out.stderr


def _example_server_main(command: str, argv: list[str]) -> int:
    """One of the example server's two command lines, run in this process."""
    from replaystore.mcp import example

    if command == "example-server":
        return main([command, *argv])
    return example.main(argv)


#: What ``serve`` gets with no option at all: the defaults README.md and
#: docs/deployment.md document.
DOCUMENTED_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 8000,
    "url": "memory://",
    "max_events": 10_000,
    "log_level": "warning",
    "lease_ttl": 5.0,
    "max_payload": 8 << 20,
    "task_ttl": 3600.0,
    "task_events": 1000,
    "task_streams": 1000,
    "task_client_streams": 16,
    "drain_seconds": 10.0,
    "ping_seconds": 15.0,
    "allowed_hosts": [],
    "check_store": False,  # main checked it first
}

EVERY_OPTION = [
    "--host", "0.0.0.0", "--port", "8123", "--url", "memory://every", "--max-events", "7",
    "--log-level", "trace", "--lease-seconds", "2.5", "--max-payload", "4096",
    "--task-ttl", "60", "--task-events", "10", "--task-streams", "50",
    "--task-client-streams", "4", "--drain-seconds", "3", "--ping-seconds", "0.5",
    "--allowed-host", "mcp.example.com", "--allowed-host", "lb:*",
]  # fmt: skip


def _served_with(
    command: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], dict[str, Any]]:
    """The log level set up and what ``serve`` was called with, for one command line.

    The start-up store check runs for real (on a memory store it finds nothing).
    """
    from replaystore.mcp import example

    levels: list[str] = []
    served: dict[str, Any] = {}

    def fake_serve(host: str, port: int, **options: Any) -> None:
        served.update(host=host, port=port, **options)

    monkeypatch.setattr(example, "configure_logging", levels.append)
    monkeypatch.setattr(example, "serve", fake_serve)
    assert _example_server_main(command, argv) == 0
    return levels, served


@pytest.mark.parametrize("command", ["example-server", "replaystore.mcp.example"])
def test_both_example_server_command_lines_have_the_documented_defaults(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    levels, served = _served_with(command, [], monkeypatch)
    assert levels == ["warning"]
    assert served == DOCUMENTED_DEFAULTS


def test_both_example_server_command_lines_parse_every_option_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cli = _served_with("example-server", EVERY_OPTION, monkeypatch)
    module = _served_with("replaystore.mcp.example", EVERY_OPTION, monkeypatch)
    assert cli == module
    levels, served = cli
    assert levels == ["trace"]
    assert served == {
        "host": "0.0.0.0",
        "port": 8123,
        "url": "memory://every",
        "max_events": 7,
        "log_level": "trace",
        "lease_ttl": 2.5,
        "max_payload": 4096,
        "task_ttl": 60.0,
        "task_events": 10,
        "task_streams": 50,
        "task_client_streams": 4,
        "drain_seconds": 3.0,
        "ping_seconds": 0.5,
        "allowed_hosts": ["mcp.example.com", "lb:*"],
        "check_store": False,
    }


@pytest.mark.parametrize(("option", "value"), [*BAD_SERVER_OPTIONS, ("--log-level", "loud")])
def test_both_example_server_command_lines_refuse_a_bad_option_alike(
    option: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same status and the same message, but for the program name (and the wrapping)."""
    from replaystore.mcp import example

    monkeypatch.setattr(example, "serve", _server_started)
    refusals = []
    for command, prog in [
        ("example-server", "replaystore example-server"),
        ("replaystore.mcp.example", "python -m replaystore.mcp.example"),
    ]:
        with pytest.raises(SystemExit) as exited:
            _example_server_main(command, [option, value])
        err = capsys.readouterr().err
        assert prog in err, err
        refusals.append((exited.value.code, " ".join(err.replace(prog, "PROG").split())))
    assert refusals[0] == refusals[1]
    assert refusals[0][0] == 2 and f"error: argument {option}: " in refusals[0][1]


def test_the_module_refuses_an_unreachable_store_in_one_line() -> None:
    """``python -m replaystore.mcp.example`` checks the store at start too."""
    port = find_free_port()  # nothing listens there
    out = subprocess.run(
        [sys.executable, "-m", "replaystore.mcp.example", "--port", "0",
         "--url", f"redis://127.0.0.1:{port}/0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("replaystore: ") and str(port) in lines[0], lines[0]


def test_example_server_without_the_mcp_extra_is_one_line() -> None:
    """The MCP SDK is optional: without it the command says what to install."""
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "from replaystore.commands.cli import main\n"
        "sys.exit(main(['example-server', '--url', 'memory://']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("replaystore: example-server needs the MCP extra"), lines[0]
    assert "pip install 'replaystore[mcp]'" in lines[0]


def test_bad_url_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "S", "--url", "nope://"]) == 2
    assert "no backend for scheme" in capsys.readouterr().err


# ------------------------------------------------------ inspect and probe


def _prefixed(handle: ServerHandle) -> str:
    return f"{handle.url}?prefix=cli{uuid.uuid4().hex[:8]}:"


@pytest.mark.realserver
def test_inspect_shows_a_live_session_then_its_tombstone(
    real_servers: RealServers,
) -> None:
    url = _prefixed(redis_handle(real_servers))

    async def setup() -> None:
        async with ReplayBuffer.from_url(url) as buf:
            await buf.open_session("S")
            await buf.append_many("S", "tool-1", [b"a", b"b"])
            await buf.append("S", "_GET_stream", b"c")

    anyio.run(setup)
    live = run_cli("inspect", "S", "--url", url)
    assert live.returncode == 0, live.stderr
    body = json.loads(live.stdout)
    assert body["exists"] is True and (body["floor"], body["high_water"]) == (1, 3)
    assert body["sequences"]["tool-1"] == {"floor": 1, "high_water": 2, "retained": 2}

    async def tear_down() -> None:
        async with ReplayBuffer.from_url(url) as buf:
            res = await buf.resolve_and_replay("S", "4471")  # a bare position: malformed
            assert res.verdict is Verdict.MALFORMED_CURSOR and res.evidence.torn_down

    anyio.run(tear_down)
    gone = run_cli("inspect", "S", "--url", url)
    assert gone.returncode == 1, gone.stderr
    body = json.loads(gone.stdout)
    assert body["exists"] is False
    assert body["tombstone"]["verdict"] == "malformed_cursor"
    assert body["tombstone"]["at"] > 0 and body["tombstone"]["reason"]
    # The tombstone's own expiry is shown, counting down.
    (left,) = body.pop("ttl_seconds").values()
    assert 0 < left <= 3600
    # Asking did not change anything: the tombstone is still there.
    again = json.loads(run_cli("inspect", "S", "--url", url).stdout)
    assert again.pop("ttl_seconds") and again == body


@pytest.mark.realserver
def test_inspect_shows_the_session_record_its_age_and_every_keys_ttl(
    real_servers: RealServers, capsys: pytest.CaptureFixture[str]
) -> None:
    """What MCP replicas keep beside the events: the record (revision, serving replicas), the
    session's age from its first event, and the seconds each key has left, leases included."""
    url = _prefixed(redis_handle(real_servers))

    async def setup() -> None:
        from replaystore.backends.coordination import coordination_of

        async with ReplayBuffer.from_url(url) as buf:
            await buf.open_session("S")
            anchor = await buf.append("S", "_GET_stream", None)
            registry = coordination_of(buf.backend).registry()
            fields = {"version": "2025-11-25", "get": anchor, "owner": "", "held:r1": "1"}
            await registry.put_session("S", fields, 600.0)
            assert await registry.hold("S", "r2") is not None
            assert await registry.acquire("S", "tool-1", "r2", 30.0)

    anyio.run(setup)
    assert main(["inspect", "S", "--url", url]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["record"]["revision"] == "2025-11-25"
    assert body["record"]["serving_replicas"] == ["r1", "r2"]
    assert 0 <= body["age_seconds"] < 60
    ttls = body["ttl_seconds"]
    by_suffix = {key.rsplit("}", 1)[1]: left for key, left in ttls.items()}
    assert 500 < by_suffix[":mcp"] <= 600, ttls
    assert 0 < by_suffix[":mcp:lease:tool-1"] <= 30, ttls
    assert by_suffix[":m"] > 0, ttls


@pytest.mark.realserver
def test_probe_says_how_many_events_a_resume_would_replay(
    real_servers: RealServers,
) -> None:
    url = _prefixed(redis_handle(real_servers))

    async def setup() -> list[str]:
        async with ReplayBuffer.from_url(url) as buf:
            await buf.open_session("S")
            ids = await buf.append_many("S", "tool-1", [b"1", b"2"])
            await buf.append("S", "_GET_stream", b"other stream")
            ids += await buf.append_many("S", "tool-1", [b"3", b"4", b"5"])
            return ids

    ids = anyio.run(setup)
    out = run_cli("probe", "S", ids[0], "--url", url)
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["verdict"] == "resumed" and body["would_replay"] == 4
    assert "replayed" not in body["evidence"], "a probe replays nothing: would_replay says it"
    assert body["evidence"]["sequence"] == "tool-1"
    out = run_cli("probe", "S", ids[-1], "--url", url)
    assert json.loads(out.stdout)["would_replay"] == 0

    # A failing probe tears nothing down; the real resume then replays what was announced.
    mismatch = run_cli("probe", "S", ids[0], "--sequence", "_GET_stream", "--url", url)
    assert mismatch.returncode == 1
    body = json.loads(mismatch.stdout)
    assert body["verdict"] == "sequence_mismatch" and body["would_replay"] is None
    assert "torn_down" not in body["evidence"]

    async def resume() -> list[bytes | None]:
        async with ReplayBuffer.from_url(url) as buf:
            res = (await buf.resolve_and_replay("S", ids[0])).raise_for_verdict()
            return [event.payload for event in res.events]

    assert anyio.run(resume) == [b"2", b"3", b"4", b"5"]


# -------------------------------------------------------- example-server


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"example-server exited:\n{log.read_text(errors='replace')}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("example-server did not start")


@pytest.mark.realserver
def test_example_server_log_level_reaches_the_server(
    real_servers: RealServers, tmp_path: Path
) -> None:
    """The same server at info and at warning (started together): only info shows INFO lines."""
    url = _prefixed(redis_handle(real_servers))
    started: dict[str, tuple[int, subprocess.Popen[bytes], Path]] = {}
    try:
        for level in ("info", "warning"):
            port = find_free_port()
            log = tmp_path / f"{level}.log"
            args = ["example-server", "--port", str(port), "--url", url, "--log-level", level]
            with log.open("wb") as sink:
                proc = subprocess.Popen([*COMMAND, *args], stdout=sink, stderr=subprocess.STDOUT)
            started[level] = (port, proc, log)
        for port, proc, log in started.values():
            _wait_for_port(port, proc, log)
            # The MCP layer logs a new session at INFO, and an unknown tool with its name.
            _call_an_unknown_tool(port, _initialize(port), name="n" * (1 << 20))
    finally:
        for _, proc, _ in started.values():
            proc.terminate()
            proc.wait(30)
    info, warning = (started[level][2].read_text(errors="replace") for level in started)
    assert "Application startup complete" in info, info
    assert re.search(r"^\S*\s*INFO\b", info, re.M), info
    assert "Traceback" not in info + warning
    info_records = re.findall(r"^.{0,30}\bINFO\b.*$", warning, re.M)
    assert not info_records, f"INFO records at --log-level warning: {info_records[:3]}"
    # Every record is one bounded line, even one quoting a 1 MiB tool name.
    longest = max(len(line) for line in info.splitlines())
    assert longest <= 2100 and len(info) < 64_000, (longest, len(info))
    assert " characters)" in info, "the long record was cut, not dropped"
    assert "no metrics at /metrics" not in info, "prometheus_client is installed here"
    # Where it listens, at start, whatever the level.
    for level, (port, _, log) in started.items():
        said = (
            f"MCP at http://127.0.0.1:{port}/mcp, health check at http://127.0.0.1:{port}/healthz"
        )
        assert said in log.read_text(errors="replace"), level


def test_example_server_says_when_metrics_are_off(tmp_path: Path) -> None:
    """Without prometheus_client /metrics is a 404: the log says why, at start."""
    port = find_free_port()
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from replaystore.commands.cli import main\n"
        f"sys.exit(main(['example-server', '--port', '{port}', '--url', 'memory://']))\n"
    )
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=sink, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, proc, log)
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 404
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text(errors="replace")
    assert "no metrics at /metrics: prometheus_client is not installed" in text, text
    assert "pip install 'replaystore[prometheus]'" in text


def _initialize(port: int) -> str:
    body = initialize_message()
    headers = {"accept": "application/json, text/event-stream"}
    reply = httpx.post(f"http://127.0.0.1:{port}/mcp", json=body, headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.headers["mcp-session-id"]


def _call_an_unknown_tool(port: int, session: str, name: str) -> None:
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-session-id": session,
        "mcp-protocol-version": "2025-11-25",
    }
    url = f"http://127.0.0.1:{port}/mcp"
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert httpx.post(url, json=note, headers=headers, timeout=10).status_code == 202
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name}}
    httpx.post(url, json=call, headers=headers, timeout=30)  # an error, whatever its form

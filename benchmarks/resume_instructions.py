"""Instructions a server executes per SSE resume, counted with callgrind, against two baselines.

    python -m benchmarks.resume_instructions [--resumes N] [--runs N] [--json PATH]

Replica CPU per resume measured in seconds moves 2x from run to run on a shared
2-core machine; the number of instructions the server process executes for the
same requests does not (valgrind's callgrind, ``Ir``, repeats to a fraction of
a percent). So the resume's cost at the HTTP floor is judged here in
instructions: each server runs under ``valgrind --tool=callgrind`` with
instrumentation off while its sessions are set up and warmed up, then
instrumentation goes on, counters are zeroed, N resumes run one at a time
(``GET /mcp`` with ``Mcp-Session-Id`` and ``Last-Event-ID``, a new TCP
connection each, the whole answer read by this process, which is not under
valgrind), and the counters are dumped. An idle window of the same kind right
after gives the server's background rate (timers, the collector), which the
``net`` figure subtracts in proportion to the window's wall time.

Servers (each its own process, ``PYTHONHASHSEED=0``, uvicorn as installed):

- ``floor``: ``python -m replaystore.bench.floor``, a bare ASGI app that answers
  a resume with one ``LRANGE`` and one ``send`` (the least Python can do);
- ``sdk-example``: the SDK's ``MCPServer`` with the SDK example's in-memory
  event store (``python -m replaystore.bench.peers sdk-example``);
- ``replaystore``: ``replaystore example-server`` on the Redis of the run.

Cases of ``replaystore``: ``sticky`` (resumed on the replica that ran the
call), ``rr`` (the call ran on replica A, the resumes go to replica B, which
adopted every session during the warm-up), ``rr-first`` (each measured resume
is the session's first on B: adoption included) and ``failed`` (the cursor of
another session: 404 with a verdict, each ending its session). Every good
resume presents progress event 10's id of a 20-step ``countdown`` whose
stream was closed after 12 events, so 11 events are replayed.

The ratios (``net`` Ir per resume over the floor's, and over the SDK example
store's) are what ``python -m benchmarks.targets`` judges.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replaystore.bench.servers import ServerProcess
from replaystore.testing.mcp import initialize_message, post_headers, stream_headers
from replaystore.testing.ports import find_free_port
from replaystore.testing.servers import redis_server_binary, start_standalone
from replaystore.testing.sse import SSE, sse_lines

HOST = "127.0.0.1"
CASES = ("sticky", "rr", "rr-first", "failed")


def available() -> str | None:
    """None when this machine can count instructions, else why not (for the report)."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt install valgrind)"
    return None


# ------------------------------------------------------------------ the client
# Raw sockets: one request per connection, chunked decoding and SSE by hand, so
# what the server is sent and reads is the same for every server measured.


class _Http:
    def __init__(self, port: int, timeout: float = 120.0) -> None:
        import socket

        self._sock = socket.create_connection((HOST, port), timeout=timeout)
        self._port = port
        self._buf = b""
        self.headers: dict[str, str] = {}

    def __enter__(self) -> _Http:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()

    def _fill(self) -> bool:
        data = self._sock.recv(65536)
        self._buf += data
        return bool(data)

    def _until(self, sep: bytes) -> bytes:
        while sep not in self._buf:
            if not self._fill():
                raise ConnectionError("closed early")
        head, _, self._buf = self._buf.partition(sep)
        return head

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not self._fill():
                raise ConnectionError("closed early")
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def request(self, method: str, headers: dict[str, str], body: bytes = b"") -> int:
        lines = [f"{method} /mcp HTTP/1.1", f"host: {HOST}:{self._port}", "connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if method == "POST":
            lines.append(f"content-length: {len(body)}")
        self._sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        raw = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        self.headers = {}
        for line in raw[1:]:
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()
        return int(raw[0].split()[1])

    def chunks(self) -> Iterator[bytes]:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self._until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    self._until(b"\r\n")
                    return
                yield self._exactly(size)
                self._exactly(2)
        elif "content-length" in self.headers:
            yield self._exactly(int(self.headers["content-length"]))
        else:
            while self._buf or self._fill():
                out, self._buf = self._buf, b""
                yield out


def _lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """The lines of a byte stream, without their ends."""
    text = ""
    for chunk in chunks:
        *lines, text = (text + chunk.decode()).split("\n")
        yield from (line.removesuffix("\r") for line in lines)


@dataclass
class _Session:
    index: int
    port: int
    sid: str = ""
    cursor: str = ""


@dataclass(frozen=True)
class Workload:
    """How many sessions and resumes; the call every session makes."""

    sessions: int = 50
    events: int = 20
    close_after: int = 12
    resume_from: int = 10
    warmup: int = 100
    resumes: int = 300


def _post(s: _Session, message: dict[str, Any]) -> tuple[int, dict[str, str], list[SSE]]:
    """One POST of the setup (not measured); a 503 (a server slowed down by valgrind on a
    loaded machine misses its store deadline) is sent again after its ``Retry-After``."""
    for _ in range(10):
        with _Http(s.port) as c:
            status = c.request("POST", post_headers(s.sid), json.dumps(message).encode())
            if c.headers.get("content-type", "").startswith("text/event-stream"):
                events = list(sse_lines(_lines(c.chunks())))
            else:
                events = [SSE(None, b"".join(c.chunks()).decode())]
        if status != 503:
            return status, c.headers, events
        time.sleep(float(c.headers.get("retry-after", "1")))
    return status, c.headers, events


def _open_session(s: _Session, w: Workload, close_after: int) -> None:
    status, headers, _ = _post(s, initialize_message())
    if status != 200:
        raise RuntimeError(f"initialize answered {status}")
    s.sid = headers["mcp-session-id"]
    _post(s, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    call = {
        "jsonrpc": "2.0",
        "id": s.index + 1,
        "method": "tools/call",
        "params": {
            "name": "countdown",
            "arguments": {"n": w.events, "interval_ms": 0, "close_after": close_after},
            "_meta": {"progressToken": f"t{s.index}"},
        },
    }
    status, _, events = _post(s, call)
    if status != 200:
        raise RuntimeError(f"tools/call answered {status}")
    for event in events:
        message = event.message
        if message and message.get("params", {}).get("progress") == w.resume_from:
            s.cursor = event.id or ""
    if not s.cursor:
        raise RuntimeError(f"progress {w.resume_from} not seen: {events!r}")


@dataclass
class _Answer:
    status: int
    progress: int = 0
    results: int = 0


def _resume(s: _Session, port: int, cursor: str, stop_at_result: bool) -> _Answer:
    """A GET with ``Last-Event-ID`` on a new connection, its whole answer read.

    The SDK example's stream stays open after its last event: the client closes
    it once the call's result arrived (``stop_at_result``); the others end it.
    """
    with _Http(port) as c:
        answer = _Answer(c.request("GET", stream_headers(s.sid, cursor)))
        if answer.status != 200:
            b"".join(c.chunks())
            return answer
        for event in sse_lines(_lines(c.chunks())):
            message = event.message
            if message is None:
                continue
            if message.get("method") == "notifications/progress":
                answer.progress += 1
            elif message.get("id") == s.index + 1 and "result" in message:
                answer.results += 1
                if stop_at_result:
                    break
        return answer


# ------------------------------------------------------------------ the servers


@dataclass
class _Server:
    """A server process (``replaystore.bench.servers``), maybe under callgrind (``out``)."""

    kind: str
    port: int
    process: ServerProcess
    out: Path | None
    dumps: set[Path] = field(default_factory=set)

    def control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.process.pid)],
            check=True,
            capture_output=True,
            timeout=300,
        )

    def dump(self) -> int:
        """Dump the counters; the total ``Ir`` of the new dump once it is complete."""
        assert self.out is not None
        self.control("-d")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for path in self.out.parent.glob(self.out.name + ".*"):
                if path in self.dumps:
                    continue
                found = re.search(r"^totals:\s*(\d+)", path.read_text(errors="replace"), re.M)
                if found:
                    self.dumps.add(path)
                    return int(found.group(1))
            time.sleep(0.05)
        raise RuntimeError(f"no callgrind dump from {self.kind}")

    def stop(self) -> None:
        self.process.stop(timeout=60)


def _argv(kind: str, port: int, url: str, prefix: str) -> list[str]:
    py = sys.executable
    if kind == "replaystore":
        return [py, "-m", "replaystore", "example-server", "--host", HOST, "--port", str(port),
                "--url", f"{url}?prefix={prefix}", "--log-level", "error"]  # fmt: skip
    if kind == "floor":
        return [py, "-m", "replaystore.bench.floor", "--host", HOST, "--port", str(port),
                "--url", url, "--prefix", prefix]  # fmt: skip
    if kind == "sdk-example":
        return [py, "-m", "replaystore.bench.peers", "sdk-example", "--host", HOST,
                "--port", str(port)]  # fmt: skip
    raise ValueError(kind)


def _start(kind: str, url: str, prefix: str, workdir: Path, tag: str, counted: bool) -> _Server:
    port = find_free_port()
    argv = _argv(kind, port, url, prefix)
    out = workdir / f"callgrind.{kind}.{tag}.out" if counted else None
    if out is not None:
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                "--dump-instr=no", "--instr-atstart=no", *argv]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    process = ServerProcess(argv, [port], workdir / f"{kind}.{tag}.log", env=env).start()
    try:
        process.wait_ready(timeout=600)  # a Python start-up under valgrind takes a while
    except BaseException:
        process.stop()
        raise
    return _Server(kind, port, process, out)


# ------------------------------------------------------------------ one measure

_Item = tuple[_Session, str, bool]  # session, cursor, a good answer expected


@dataclass(frozen=True)
class Figure:
    """One server and case: instructions per resume, gross and net of idle work."""

    server: str
    case: str
    resumes: int
    ir_per_resume: float
    ir_per_resume_net: float
    idle_ir_per_s: float
    unexpected: int
    answers: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _sessions(port: int, first: int, n: int, w: Workload, close_after: int) -> list[_Session]:
    out = []
    for i in range(first, first + n):
        s = _Session(i, port)
        _open_session(s, w, close_after)
        out.append(s)
    return out


def _plan(case: str, home: int, w: Workload, close_after: int) -> tuple[list[_Item], list[_Item]]:
    """The warm-up and the measured resumes of ``case``, on sessions opened at ``home``."""
    if case in ("sticky", "rr"):
        base = _sessions(home, 0, w.sessions, w, close_after)
        warm = [(s, s.cursor, True) for s in base] * max(1, -(-w.warmup // len(base)))
        picked = [base[i % len(base)] for i in range(w.resumes)]
        return warm, [(s, s.cursor, True) for s in picked]
    if case == "rr-first":
        fresh = _sessions(home, 0, w.warmup + w.resumes, w, close_after)
        return [(s, s.cursor, True) for s in fresh[: w.warmup]], [
            (s, s.cursor, True) for s in fresh[w.warmup :]
        ]
    if case == "failed":
        # Good resumes first, then failed ones: each presents the cursor of a donor session
        # that is never resumed; each failed resume ends its session, so each uses its own.
        base = _sessions(home, 0, w.sessions, w, close_after)
        donor = _sessions(home, w.sessions, 1, w, close_after)[0]
        victims = _sessions(home, w.sessions + 1, w.warmup // 2 + w.resumes, w, close_after)
        warm = [(s, s.cursor, True) for s in base[: w.warmup - w.warmup // 2]]
        warm += [(s, donor.cursor, False) for s in victims[: w.warmup // 2]]
        return warm, [(s, donor.cursor, False) for s in victims[w.warmup // 2 :]]
    raise ValueError(case)


def _resumes(
    items: Sequence[_Item], port: int, w: Workload, stop_at_result: bool, answers: dict[str, int]
) -> int:
    """Run ``items`` one at a time; how many answers were not the expected kind."""
    unexpected = 0
    answers.clear()
    for s, cursor, good_expected in items:
        a = _resume(s, port, cursor, stop_at_result)
        key = f"{a.status} progress={a.progress} results={a.results}"
        answers[key] = answers.get(key, 0) + 1
        good = a.status == 200 and a.progress == w.events - w.resume_from and a.results == 1
        unexpected += good != good_expected or (not good and a.status != 404)
    return unexpected


def measure(
    kind: str, case: str, w: Workload, url: str, workdir: Path, *, settle: float, idle: float
) -> Figure:
    """Count one server's instructions over ``w.resumes`` resumes of ``case``."""
    tag = f"{case}.{time.monotonic_ns()}"
    prefix = f"ir{os.getpid()}{tag}:"
    # The floor stores only the events after the ones it sent, and resumes from the
    # last one sent or later: it closes after exactly ``resume_from`` (the same replay).
    close_after = w.resume_from if kind == "floor" else w.close_after
    stop_at_result = kind == "sdk-example"
    servers: list[_Server] = []
    try:
        if case in ("rr", "rr-first"):
            servers.append(_start(kind, url, prefix, workdir, tag + ".A", counted=False))
        counted = _start(kind, url, prefix, workdir, tag, counted=True)
        servers.append(counted)
        warm, measured = _plan(case, servers[0].port, w, close_after)
        time.sleep(0.5)  # every call's tool has finished (it runs on after its stream closed)
        answers: dict[str, int] = {}
        _resumes(warm, counted.port, w, stop_at_result, answers)
        counted.control("-i", "on")
        time.sleep(settle)
        counted.control("-z")
        started = time.monotonic()
        unexpected = _resumes(measured, counted.port, w, stop_at_result, answers)
        time.sleep(settle)
        total = counted.dump()
        window = time.monotonic() - started
        counted.control("-z")
        idle_started = time.monotonic()
        time.sleep(idle)
        rate = counted.dump() / (time.monotonic() - idle_started)
        n = len(measured)
        net = (total - rate * window) / n
        return Figure(kind, case, n, total / n, net, rate, unexpected, dict(answers))
    finally:
        for server in servers:
            server.stop()


# ------------------------------------------------------------------ the run

#: (server, case) of every figure, in the order they are measured.
ROWS: tuple[tuple[str, str], ...] = (
    ("floor", "sticky"),
    ("sdk-example", "sticky"),
    ("replaystore", "sticky"),
    ("replaystore", "rr"),
    ("replaystore", "rr-first"),
    ("replaystore", "failed"),
)


def run(
    w: Workload,
    *,
    runs: int = 2,
    rows: Sequence[tuple[str, str]] = ROWS,
    settle: float = 2.0,
    idle: float = 5.0,
    log: Any = None,
) -> dict[str, Any]:
    """Every row ``runs`` times on a Redis started for the run; each row's figures and ratios.

    A row's ``ir`` is the median of its runs' net figures; ``spread`` is
    (max - min) / min over them, so a reader sees whether two runs agreed.
    """
    why_not = available()
    if why_not is not None:
        return {"skipped": why_not}
    figures: dict[str, list[Figure]] = {}
    with (
        start_standalone(redis_server_binary()) as redis,
        tempfile.TemporaryDirectory(prefix="resume-ir-") as tmp,
    ):
        url = redis.url
        for attempt in range(runs):
            for kind, case in rows:
                fig = measure(kind, case, w, url, Path(tmp), settle=settle, idle=idle)
                figures.setdefault(f"{kind}/{case}", []).append(fig)
                if log is not None:
                    print(
                        f"run {attempt + 1}: {kind:<12} {case:<9} "
                        f"{fig.ir_per_resume_net / 1e6:6.3f}M Ir per resume (net)"
                        + (
                            f", {fig.unexpected} unexpected answers: {fig.answers}"
                            if fig.unexpected
                            else ""
                        ),
                        file=log,
                        flush=True,
                    )
    rows_out: dict[str, Any] = {}
    for key, figs in figures.items():
        nets = sorted(f.ir_per_resume_net for f in figs)
        rows_out[key] = {
            "ir": statistics.median(nets),
            "runs": [f.as_dict() for f in figs],
            "spread": (nets[-1] - nets[0]) / nets[0] if nets[0] > 0 else 0.0,
            "unexpected": sum(f.unexpected for f in figs),
        }
    floor = rows_out.get("floor/sticky", {}).get("ir")
    sdk = rows_out.get("sdk-example/sticky", {}).get("ir")
    for row in rows_out.values():
        row["vs_floor"] = row["ir"] / floor if floor else None
        row["vs_sdk_example"] = row["ir"] / sdk if sdk else None
    return {"workload": w.__dict__, "rows": rows_out}


def table(report: dict[str, Any]) -> str:
    if "skipped" in report:
        return f"instruction counts skipped: {report['skipped']}"
    lines = [
        f"{'server/case':<22} {'Ir per resume':>14} {'÷ floor':>8} {'÷ SDK example':>14} "
        f"{'runs spread':>12}"
    ]
    for key, row in report["rows"].items():
        vs_floor = f"{row['vs_floor']:.2f}x" if row["vs_floor"] else "-"
        vs_sdk = f"{row['vs_sdk_example']:.2f}x" if row["vs_sdk_example"] else "-"
        lines.append(
            f"{key:<22} {row['ir'] / 1e6:>13.3f}M {vs_floor:>8} {vs_sdk:>14} "
            f"{100 * row['spread']:>11.2f}%"
            + (f"  ({row['unexpected']} unexpected answers)" if row["unexpected"] else "")
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.resume_instructions")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--resumes", type=int, default=300)
    parser.add_argument("--case", action="append", choices=[f"{k}/{c}" for k, c in ROWS])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = [tuple(r.split("/")) for r in args.case] if args.case else ROWS
    w = Workload(sessions=args.sessions, warmup=args.warmup, resumes=args.resumes)
    report = run(w, runs=args.runs, rows=rows, log=sys.stderr)
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

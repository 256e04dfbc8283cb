"""Run the official MCP conformance suite against one process and three replicas; print one table.

Started by ``scripts/conformance`` (which installs Node and the suite first).
Everything runs on loopback and is stopped at the end, whatever happens:

- a ``redis-server`` on a free port, in a temporary directory, no persistence;
- one ``examples/conformance_server.py`` on it (the "one process" column);
- three more on the same Redis (another database) behind
  ``scripts/round_robin_proxy.py``, which sends each request to the next
  replica on a new connection (the "three replicas" column).

Each target gets ``--requirements 2026-07-28`` (which also runs the tasks
extension's scenarios, unscored), any ``tasks-*`` scenario it did not run,
and ``--requirements 2025-11-25``. A cell reads ``ok N`` (N checks passed),
``FAIL k/N`` with the failed check ids listed under the table, or
``skipped`` (a placeholder scenario that checks nothing yet).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TASK_SCENARIOS = (
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
)
_STAMP = re.compile(r"-\d{4}-\d\d-\d\dT[\d-]+Z$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Processes:
    """Every process started here, each in its own group; all stopped on exit."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.started.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.started:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer in {timeout} s")
        time.sleep(0.2)


def wait_redis(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis-server on {port} did not start")
        time.sleep(0.1)


def replica(procs: Processes, name: str, url: str) -> int:
    port = free_port()
    procs.start(
        name,
        PYTHON,
        "examples/conformance_server.py",
        "--port",
        str(port),
        "--url",
        url,
    )
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return port


Results = dict[tuple[str, str], list[dict[str, object]]]


def run_suite(suite: list[str], url: str, label: str, args: list[str], out: Path) -> Results:
    """Run the suite once; the checks of each scenario it ran, keyed by (label, scenario)."""
    out.mkdir(parents=True, exist_ok=True)
    command = [*suite, "server", "--url", url, *args, "-o", str(out)]
    with (out / "output.txt").open("wb") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=1800, check=False)
    results: Results = {}
    for checks in sorted(out.glob("server-*/checks.json")):
        scenario = _STAMP.sub("", checks.parent.name.removeprefix("server-"))
        results[(label, scenario)] = json.loads(checks.read_text())
    return results


def run_target(suite: list[str], url: str, out: Path) -> Results:
    results = run_suite(suite, url, "2026-07-28", ["--requirements", "2026-07-28"], out / "2026")
    for scenario in TASK_SCENARIOS:
        if ("2026-07-28", scenario) not in results:
            args = ["--scenario", scenario]
            results.update(run_suite(suite, url, "2026-07-28", args, out / scenario))
    results.update(
        run_suite(suite, url, "2025-11-25", ["--requirements", "2025-11-25"], out / "2025")
    )
    return results


def cell(checks: list[dict[str, object]] | None, failures: list[str]) -> str:
    if checks is None:
        return "not run"
    counted = [c for c in checks if c.get("status") in ("SUCCESS", "FAILURE", "WARNING")]
    if not counted:
        return "skipped"
    failed = [c for c in counted if c.get("status") == "FAILURE"]
    warned = [c for c in counted if c.get("status") == "WARNING"]
    for check in failed:
        failures.append(f"{check.get('id')}: {str(check.get('errorMessage', ''))[:160]}")
    text = f"FAIL {len(failed)}/{len(counted)}" if failed else f"ok {len(counted)}"
    return text + (f", {len(warned)} warning(s)" if warned else "")


def table(one: Results, three: Results) -> str:
    keys = sorted(set(one) | set(three), key=lambda k: (k[0] != "2026-07-28", k[1]))
    rows = [("set", "scenario", "one process", "three replicas")]
    notes: list[str] = []
    for key in keys:
        fail_one: list[str] = []
        fail_three: list[str] = []
        rows.append(
            (key[0], key[1], cell(one.get(key), fail_one), cell(three.get(key), fail_three))
        )
        notes += [f"  one process, {key[1]}: {f}" for f in fail_one]
        notes += [f"  three replicas, {key[1]}: {f}" for f in fail_three]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if notes:
        lines += ["", "failed checks:", *notes]
    return "\n".join(lines)


@contextlib.contextmanager
def workspace(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="replaystore-conformance-"))
    try:
        yield path
    finally:
        if keep:
            print(f"logs and results kept in {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--node", required=True, help="the node binary (22 or later)")
    parser.add_argument("--suite", required=True, help="the suite's dist/index.js")
    parser.add_argument("--keep", action="store_true", help="keep logs and results")
    args = parser.parse_args()
    suite = [args.node, args.suite]
    with workspace(args.keep) as work:
        procs = Processes(work)
        try:
            redis_port = free_port()
            redis = shutil.which("redis-server") or "redis-server"
            procs.start(
                "redis", redis, "--port", str(redis_port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(work),
            )  # fmt: skip
            wait_redis(redis_port)
            single = replica(procs, "one-process", f"redis://127.0.0.1:{redis_port}/0")
            ports = [
                replica(procs, f"replica-{i}", f"redis://127.0.0.1:{redis_port}/1")
                for i in (1, 2, 3)
            ]
            proxy_port = free_port()
            upstreams = [arg for port in ports for arg in ("--upstream", f"127.0.0.1:{port}")]
            procs.start(
                "proxy", PYTHON, "scripts/round_robin_proxy.py", "--port", str(proxy_port),
                *upstreams,
            )  # fmt: skip
            wait_http(f"http://127.0.0.1:{proxy_port}/healthz")
            print("running the suite against one process ...", file=sys.stderr)
            one = run_target(suite, f"http://127.0.0.1:{single}/mcp", work / "one")
            print(
                "running the suite against three replicas behind round robin ...", file=sys.stderr
            )
            three = run_target(suite, f"http://127.0.0.1:{proxy_port}/mcp", work / "three")
        finally:
            procs.stop()
        print(table(one, three))
        spread = (work / "proxy.log").read_text().strip()
        print(f"\nround-robin proxy, {spread}")
        failed = any(c.get("status") == "FAILURE" for checks in three.values() for c in checks)
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

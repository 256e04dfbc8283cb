"""The shipped balancers (nginx, HAProxy on ``deploy/``) and restartable replicas behind them.

Shared by the modules that run the deployment of ``docs/deployment.md``
(``test_balancers.py``, ``test_balancer_errors.py``, ``test_user_app_drain.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from replaystore.testing.servers import find_free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

#: The replicas' lease (seconds): a killed replica's call ends within about this plus a check.
LEASE = 3
#: How long a stopping replica lets its calls finish.
DRAIN = 5


def _ensure_balancers() -> None:
    """nginx and HAProxy on PATH, installed with apt-get when missing."""
    if shutil.which("nginx") and shutil.which("haproxy"):
        return
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.fail("nginx/haproxy are not installed and there is no apt-get to install them")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in ([apt, "update", "-q"], [apt, "install", "-y", "-q", "nginx", "haproxy"]):
        done = subprocess.run([*sudo, *args], env=env, capture_output=True, timeout=600)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert shutil.which("nginx") and shutil.which("haproxy")


def render(text: str, replica_ports: list[int], listen: int) -> str:
    """A deploy/ file with loopback addresses: ``replicaN:8000`` and the listening port."""
    for i, port in enumerate(replica_ports, 1):
        text = text.replace(f"replica{i}:8000", f"127.0.0.1:{port}")
    # An address is not looked up again (and nginx before 1.27.3 does not know `resolve`).
    text = text.replace(" resolve max_fails", " max_fails")
    text = re.sub(r"(?m)^(\s*)listen 8080;", rf"\g<1>listen 127.0.0.1:{listen};", text)
    return re.sub(r"(?m)^(\s*)bind :8080$", rf"\g<1>bind 127.0.0.1:{listen}", text)


@dataclass
class Replica:
    """One ``replaystore example-server`` process, restartable on its port."""

    port: int
    store: str
    logs: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        log = self.logs / f"replica-{self.port}-{self.starts}.log"
        args = [
            sys.executable, "-m", "replaystore", "example-server",
            "--host", "127.0.0.1", "--port", str(self.port), "--url", self.store,
            "--lease-seconds", str(LEASE), "--drain-seconds", str(DRAIN),
            "--log-level", "warning",
        ]  # fmt: skip
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_healthy(self, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None and self.proc.poll() is None, self.log_tail()
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"{self.base}/healthz", timeout=2)
                if answer.status_code == 200:
                    return answer.text
            assert time.monotonic() < deadline, f"replica {self.port} not healthy"
            time.sleep(0.1)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = DRAIN + 10) -> float:
        """Signal the process, wait for it to end; the seconds it took."""
        started = time.monotonic()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return time.monotonic() - started

    def log_tail(self) -> str:
        files = sorted(self.logs.glob(f"replica-{self.port}-*.log"))
        return files[-1].read_text(errors="replace")[-3000:] if files else ""


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        assert proc.poll() is None, f"{what} exited"
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        assert time.monotonic() < deadline, f"{what} does not listen on {port}"
        time.sleep(0.05)


def _start_balancers(
    work: Path, ports: list[int], procs: list[subprocess.Popen[bytes]]
) -> tuple[int, int, Path]:
    """nginx and HAProxy on the deploy/ files in front of ``ports``: their ports, HAProxy's socket.

    The processes are appended to ``procs`` (the caller stops them).
    """
    work.mkdir(parents=True, exist_ok=True)
    # nginx started as root runs its workers as nobody: they write request
    # bodies larger than a buffer to files under here.
    work.chmod(0o755)
    nginx_port, haproxy_port = find_free_port(), find_free_port()
    (work / "replaystore.conf").write_text(
        render((DEPLOY / "nginx.conf").read_text(), ports, nginx_port)
    )
    temp = " ".join(
        f"{kind}_temp_path {work}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (work / "nginx.conf").write_text(
        f"daemon off;\nworker_processes 1;\npid {work}/nginx.pid;\n"
        f"error_log {work}/nginx-error.log warn;\nevents {{ worker_connections 1024; }}\n"
        f"http {{ access_log off; {temp} include {work}/replaystore.conf; }}\n"
    )
    (work / "haproxy.cfg").write_text(
        render((DEPLOY / "haproxy.cfg").read_text(), ports, haproxy_port)
    )
    socket_path = work / "haproxy.sock"
    # The test's own addition, in a file of its own: a socket to read HAProxy's health view.
    (work / "haproxy-stats.cfg").write_text(f"global\n    stats socket {socket_path}\n")

    nginx = [
        "nginx", "-p", str(work), "-e", str(work / "nginx-error.log"),
        "-c", str(work / "nginx.conf"),
    ]  # fmt: skip
    haproxy = [
        "haproxy", "-db",
        "-f", str(work / "haproxy-stats.cfg"), "-f", str(work / "haproxy.cfg"),
    ]  # fmt: skip
    for args, log in ((nginx, "nginx.out"), (haproxy, "haproxy.out")):
        check = subprocess.run([*args, "-t"] if args[0] == "nginx" else [*args, "-c"],
                               capture_output=True)  # fmt: skip
        assert check.returncode == 0, check.stderr.decode(errors="replace")
        with (work / log).open("wb") as out:
            procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out))
    _wait_port(nginx_port, procs[-2], "nginx")
    _wait_port(haproxy_port, procs[-1], "haproxy")
    return nginx_port, haproxy_port, socket_path

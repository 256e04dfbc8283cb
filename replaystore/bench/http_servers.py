"""The HTTP storm's server replicas: started per store, stopped, their CPU read from ``/proc``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..testing.servers import find_free_port

if TYPE_CHECKING:
    from .http import HttpStore

__all__ = ["HOST", "Servers", "with_prefix", "without_prefix"]

HOST = "127.0.0.1"


def with_prefix(url: str, prefix: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "prefix"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("prefix", prefix)])))


def without_prefix(url: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "prefix"]
    return urlunsplit(parts._replace(query=urlencode(query)))


class Servers:
    """R server processes of one store on loopback: started, waited for, always stopped."""

    def __init__(self, store: HttpStore, count: int, url: str, prefix: str) -> None:
        self._argv: list[list[str]] = []
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs = Path(tempfile.mkdtemp(prefix="replaystore-bench-http-"))
        for _ in range(count):
            port = find_free_port()
            self.ports.append(port)
            if store.server == "replaystore":
                argv = [
                    sys.executable, "-m", "replaystore", "example-server", "--host", HOST,
                    "--port", str(port), "--url", with_prefix(url, prefix),
                    "--log-level", "error",
                ]  # fmt: skip
            else:
                argv = [
                    sys.executable, "-m", "replaystore.bench.peer_server", store.server,
                    "--host", HOST, "--port", str(port), "--url", without_prefix(url),
                    "--prefix", prefix,
                ]  # fmt: skip
            self._argv.append(argv)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [(HOST, p) for p in self.ports]

    def __enter__(self) -> Servers:
        try:
            for i, argv in enumerate(self._argv):
                with (self._logs / f"replica-{i}.log").open("wb") as out:
                    self.procs.append(
                        subprocess.Popen(
                            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
                        )
                    )
            deadline = time.monotonic() + 60
            for i, (proc, port) in enumerate(zip(self.procs, self.ports, strict=True)):
                while True:
                    if proc.poll() is not None:
                        log = (self._logs / f"replica-{i}.log").read_text(errors="replace")
                        raise RuntimeError(f"server replica exited: {log[-2000:]}")
                    try:
                        socket.create_connection((HOST, port), timeout=0.5).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"server replica on {port} not ready") from None
                        time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def cpu_seconds(self) -> list[float | None]:
        """Each replica's CPU time so far (user + system, from ``/proc``; None once gone)."""
        return [_proc_cpu(p.pid) if p.poll() is None else None for p in self.procs]

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(10)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs.clear()


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process, or None where ``/proc`` cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / _TICKS

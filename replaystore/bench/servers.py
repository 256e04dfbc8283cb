"""Server processes on loopback: started, waited for, always stopped, their CPU read.

Every benchmark that measures servers as separate processes starts them here:
``replaystore bench storm --http`` (each store's replicas), and the studies of
``benchmarks/`` (task servers, idle replicas). A server is ready when every
port it serves accepts a TCP connection (uvicorn listens once its app has
started); one that exits before that fails the run with the end of its log.
Stopping sends SIGTERM to every process first and then waits for each, so a
group of replicas shuts down in the time of one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["HOST", "ServerProcess", "Servers"]

HOST = "127.0.0.1"


class ServerProcess:
    """One server process serving ``ports`` on loopback, its output in ``log``."""

    def __init__(
        self,
        argv: Sequence[str],
        ports: Sequence[int],
        log: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.ports = list(ports)
        self.log = log
        self._cwd = cwd
        self._env = None if env is None else dict(env)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> ServerProcess:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self._cwd,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return once every port accepts a connection; raise if the process exits first."""
        assert self.proc is not None, "not started"
        deadline = time.monotonic() + timeout
        for port in self.ports:
            while True:
                if self.proc.poll() is not None:
                    log = self.log.read_text(errors="replace")
                    raise RuntimeError(f"server on {port} exited: {log[-2000:]}")
                try:
                    socket.create_connection((HOST, port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"server on {port} not ready") from None
                    time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM) without waiting."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it is still there after ``timeout`` seconds."""
        if self.proc is None:
            return
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def kill(self) -> None:
        """SIGKILL: the server dies as a crashed replica does, nothing flushed."""
        assert self.proc is not None, "not started"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def cpu_seconds(self) -> float | None:
        """CPU time so far (user + system, from ``/proc``; None once gone)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        return proc_cpu(self.proc.pid)


class Servers:
    """A group of :class:`ServerProcess`: all started and ready, or none left running."""

    def __init__(
        self,
        commands: Sequence[tuple[Sequence[str], Sequence[int]]],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        logs: Path | None = None,
        ready_timeout: float = 60.0,
        stop_timeout: float = 10.0,
    ) -> None:
        """``commands``: each server's argv and the ports it serves."""
        self._logs = logs or Path(tempfile.mkdtemp(prefix="replaystore-bench-servers-"))
        self._ready_timeout = ready_timeout
        self._stop_timeout = stop_timeout
        self.servers = [
            ServerProcess(argv, ports, self._logs / f"replica-{i}.log", cwd=cwd, env=env)
            for i, (argv, ports) in enumerate(commands)
        ]

    @property
    def ports(self) -> list[int]:
        return [p for s in self.servers for p in s.ports]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [(HOST, p) for p in self.ports]

    def __enter__(self) -> Servers:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Servers:
        try:
            for server in self.servers:
                server.start()
            deadline = time.monotonic() + self._ready_timeout
            for server in self.servers:
                server.wait_ready(max(0.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def cpu_seconds(self) -> list[float | None]:
        """Each server's CPU time so far (None once gone)."""
        return [s.cpu_seconds() for s in self.servers]

    def kill(self, i: int) -> None:
        self.servers[i].kill()

    def stop(self) -> None:
        for server in self.servers:
            server.terminate()
        for server in self.servers:
            server.stop(self._stop_timeout)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu(pid: int) -> float | None:
    """CPU seconds of a process so far, or None where ``/proc`` cannot tell.

    The scheduler's own count (``/proc/<pid>/task/*/schedstat``, nanoseconds
    on a CPU, summed over the process's threads) where the kernel keeps it:
    the ``utime``/``stime`` of ``/proc/<pid>/stat`` are counted in clock
    ticks (10 ms here), sampled, so a replica's tenth of a second of work in
    one storm round was read with a tenth of its size as error. Else those.
    """
    try:
        total = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / _TICKS

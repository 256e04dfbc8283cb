"""``replaystore example-server`` replicas on loopback: started, waited for, always stopped.

Each replica is the command a user runs (``python -m replaystore example-server
--port P --url URL``), so a benchmark or test through them goes through the
real HTTP stack, the real SDK and the real store.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .servers import find_free_port

__all__ = ["ExampleServers"]

_HOST = "127.0.0.1"


@dataclass
class _Replica:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path


class ExampleServers:
    """``count`` example-server processes sharing one store URL."""

    def __init__(self, count: int, url: str, *, max_events: int = 10_000) -> None:
        self.count = count
        self.url = url
        self.max_events = max_events
        self.replicas: list[_Replica] = []
        self._logs = Path(tempfile.mkdtemp(prefix="replaystore-example-"))

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [(_HOST, r.port) for r in self.replicas]

    def __enter__(self) -> ExampleServers:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> ExampleServers:
        try:
            for i in range(self.count):
                port = find_free_port()
                log = self._logs / f"replica-{i}.log"
                args = [
                    sys.executable, "-m", "replaystore", "example-server",
                    "--host", _HOST, "--port", str(port), "--url", self.url,
                    "--max-events", str(self.max_events), "--log-level", "error",
                ]  # fmt: skip
                with log.open("wb") as out:
                    proc = subprocess.Popen(
                        args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
                    )
                self.replicas.append(_Replica(port, proc, log))
            deadline = time.monotonic() + timeout
            for r in self.replicas:
                while True:
                    if r.proc.poll() is not None:
                        raise RuntimeError(f"example-server exited: {r.log.read_text()[-2000:]}")
                    try:
                        socket.create_connection((_HOST, r.port), timeout=0.5).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"example-server on {r.port} not ready") from None
                        time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for r in self.replicas:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in self.replicas:
            try:
                r.proc.wait(10)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait(5)
        self.replicas.clear()

"""Worker processes that play server replicas: started, waited for, always stopped.

A load test whose load comes from one process measures that process. A
:class:`ReplicaPool` starts ``count`` fresh interpreters (``spawn``) that each
run ``target(conn)`` (``"package.module:function"``), talks to them over one
pipe each, and stops them on exit, killing any that does not stop in time.

The protocol on the pipe is small: the worker sends ``("ready", None)`` once
it is up; for each command the parent sends, it answers any number of
``("progress", n)`` and then one ``("ok", result)`` or ``("error", text)``. The
parent sends ``None`` to make it return. ``threads=True`` runs the workers as
threads of this process instead (for stores that live in process memory).
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

__all__ = ["ReplicaError", "ReplicaPool", "run_worker"]


class ReplicaError(RuntimeError):
    """A replica failed a command, died, or did not answer in time."""


def _resolve(target: str) -> Callable[[Connection], None]:
    module, _, name = target.partition(":")
    func: Callable[[Connection], None] = getattr(importlib.import_module(module), name)
    return func


def run_worker(target: str, conn: Connection) -> None:
    """Entry point of a replica: run ``target(conn)``; report a crash instead of vanishing.

    A replica process ignores SIGINT: Ctrl-C in a terminal reaches every
    process of the group, and the parent, not each replica with a traceback
    of its own, decides how the run ends (it stops the replicas itself).
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _resolve(target)(conn)
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


class ReplicaPool:
    def __init__(
        self, target: str, count: int, *, threads: bool = False, start_timeout: float = 120.0
    ) -> None:
        if count < 1:
            raise ValueError("a pool needs at least one replica")
        self.target = target
        self.count = count
        self.threads = threads
        self.start_timeout = start_timeout
        self._conns: list[Connection] = []
        self._workers: list[Any] = []

    def __enter__(self) -> ReplicaPool:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # After a failure or an interrupt the replicas are mid-command and will
        # not read the request to return: do not wait long before stopping them.
        self.stop(10.0 if exc_type is None else 1.0)

    def start(self) -> ReplicaPool:
        """Start every replica and wait until each says it is ready."""
        ctx = multiprocessing.get_context("spawn")
        try:
            for i in range(self.count):
                parent, child = ctx.Pipe()
                worker: Any
                if self.threads:
                    worker = threading.Thread(
                        target=run_worker, args=(self.target, child), name=f"replica-{i}"
                    )
                    worker.daemon = True
                else:
                    worker = ctx.Process(
                        target=run_worker, args=(self.target, child), name=f"replica-{i}"
                    )
                worker.start()
                if not self.threads:
                    child.close()  # the child process holds its own end
                self._conns.append(parent)
                self._workers.append(worker)
            for i in range(self.count):
                self._expect(i, "ready", self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def call_all(
        self,
        commands: Sequence[Any],
        *,
        timeout: float = 3600.0,
        on_progress: Callable[[int], None] | None = None,
    ) -> list[Any]:
        """Send one command to each replica, wait for every answer (in replica order)."""
        if len(commands) != self.count:
            raise ValueError("one command per replica")
        for conn, command in zip(self._conns, commands, strict=True):
            conn.send(command)
        results: list[Any] = [None] * self.count
        pending = set(range(self.count))
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise ReplicaError(f"replicas {sorted(pending)} did not answer in {timeout} s")
            for i in sorted(pending):
                while self._conns[i].poll(0.05 / self.count):
                    kind, value = self._recv(i)
                    if kind == "progress":
                        if on_progress is not None:
                            on_progress(value)
                        continue
                    if kind == "ok":
                        results[i] = value
                        pending.discard(i)
                        break
                    raise ReplicaError(f"replica {i} failed:\n{value}")
                else:
                    if not self._alive(i):
                        raise ReplicaError(f"replica {i} exited")
        return results

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every replica to return; kill those that do not within ``timeout``."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))
            if not self.threads and worker.is_alive():
                worker.terminate()
                worker.join(2.0)
                if worker.is_alive():
                    worker.kill()
                    worker.join()
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        self._workers.clear()

    def _alive(self, i: int) -> bool:
        return bool(self._workers[i].is_alive())

    def _recv(self, i: int) -> tuple[str, Any]:
        try:
            message: tuple[str, Any] = self._conns[i].recv()
        except EOFError:
            raise ReplicaError(f"replica {i} exited") from None
        return message

    def _expect(self, i: int, kind: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._conns[i].poll(0.1):
            if not self._alive(i):
                raise ReplicaError(f"replica {i} exited while starting")
            if time.monotonic() > deadline:
                raise ReplicaError(f"replica {i} did not start in {timeout} s")
        got, value = self._recv(i)
        if got != kind:
            raise ReplicaError(f"replica {i}: expected {kind!r}, got {got!r}: {value}")

"""Free loopback ports for test servers, outside the kernel's ephemeral range.

Why not just bind port 0: the kernel then picks from its ephemeral range,
the same range it draws the source port of every outgoing connection from.
A test that stops a server and starts it again on its port (a killed
replica, a restarted Redis) can find that port taken in between, by another
test's server or by any client connection, and everything behind that
server's address fails with "address already in use".

So ports come from below the ephemeral range, where the kernel never puts an
outgoing connection, split between the pytest-xdist workers (each worker
draws from its own share, so two workers never hand out the same port) and
handed out in turn within a process (so a port given to a server that is
down for a moment is not handed out again soon). Each candidate is still
bound once to check that it is free now.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Iterator

__all__ = ["find_free_port", "port_is_free"]

HOST = "127.0.0.1"

# The lowest port handed out: above the well-known and most registered ports.
_LOWEST = 10000
_FALLBACK_EPHEMERAL_START = 32768


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux), or the usual default."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_START


def _share() -> range:
    """This process's share of the pool: the whole pool, or one xdist worker's part of it."""
    top = _ephemeral_start()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0:
        size = (top - _LOWEST) // int(count)
        start = _LOWEST + int(worker[2:]) * size
        return range(start, start + size)
    return range(_LOWEST, top)


def _in_turn() -> Iterator[int]:
    """Every port of the share once, from a start that differs between processes."""
    share = _share()
    # Different processes of one worker (a test and a server it spawned) start far apart.
    offset = (os.getpid() * 7919) % len(share)
    return itertools.cycle([*share[offset:], *share[:offset]])


_lock = threading.Lock()
# The candidates and the process they were made for: a forked child makes its own.
_candidates: tuple[int, Iterator[int]] | None = None


def port_is_free(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def find_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free now and will not be handed out again soon.

    The port is not held: another program may still bind it before the caller
    does (callers that start a server retry on "address already in use"); but
    no outgoing connection takes it and no other test of this run is handed it.
    Where the ephemeral range starts too low to leave a pool below it, the
    kernel picks (port 0).
    """
    global _candidates
    if _ephemeral_start() - _LOWEST < 2000:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
            return port
    with _lock:
        if _candidates is None or _candidates[0] != os.getpid():
            _candidates = (os.getpid(), _in_turn())
        for _ in range(5000):
            port = next(_candidates[1])
            if port_is_free(port):
                return port
    raise OSError("no free TCP port on 127.0.0.1 below the ephemeral range")

"""A real primary and replica whose replication link can lag on demand, for failover tests.

A failover loses exactly the writes the replica had not received when it was
promoted. To make that happen on purpose, and only then, the replica follows
its primary through a :class:`~replaystore.testing.proxy.TcpProxy`: pausing
the proxy holds the replication stream back (the replica lags while both
servers stay up and answer), and promoting the replica while the stream is
held drops whatever it had not received, as a crashed primary would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .proxy import TcpProxy
from .servers import ServerHandle, redis_command, start_standalone

__all__ = ["ReplicatedPair", "start_replicated_pair"]

SYNC_TIMEOUT = 10.0
"""Seconds to wait for the replica to catch up before declaring failure."""


@dataclass
class ReplicatedPair:
    """A primary, its replica, and the proxy that carries replication between them."""

    primary: ServerHandle
    replica: ServerHandle
    link: TcpProxy

    def __enter__(self) -> ReplicatedPair:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def wait_in_sync(self, timeout: float = SYNC_TIMEOUT) -> None:
        """Block until the replica is linked and has acknowledged every write of the primary."""
        deadline = time.monotonic() + timeout
        while True:
            primary = _info(self.primary.ports[0], "replication")
            replica = _info(self.replica.ports[0], "replication")
            linked = replica.get("master_link_status") == "up"
            offset = primary.get("master_repl_offset")
            if linked and offset is not None and replica.get("slave_repl_offset") == offset:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"replica not in sync: primary {primary}, replica {replica}")
            time.sleep(0.02)

    def lag(self) -> None:
        """Hold the replication stream back: writes reach the primary, not the replica."""
        self.link.pause()

    def catch_up(self) -> None:
        """End a ``lag``: the replica receives what was held back."""
        self.link.resume()

    def promote(self) -> None:
        """Make the replica a primary with what it has, dropping whatever is still held back.

        The old primary keeps running (a client still connected to it would
        be split-brained); callers point their clients at ``replica``.
        """
        redis_command(self.replica.ports[0], "REPLICAOF", "NO", "ONE")
        self.link.set_upstreams([])
        self.link.sever_all()
        self.link.resume()

    def stop(self) -> None:
        self.link.stop()
        self.replica.stop()
        self.primary.stop()


def start_replicated_pair(binary: str, *, direct: bool = False) -> ReplicatedPair:
    """Start a primary and a replica (non-persistent, loopback) and wait until they are in sync.

    ``direct`` links the replica straight to the primary, for measurements
    where the proxy's extra hop would distort replication latency; the link
    proxy still runs (promotion works) but carries nothing, so ``lag`` has no
    effect.
    """
    primary = start_standalone(binary)
    replica: ServerHandle | None = None
    link: TcpProxy | None = None
    try:
        replica = start_standalone(binary)
        # A full sync otherwise waits 5 s for more replicas to share the transfer.
        redis_command(primary.ports[0], "CONFIG", "SET", "repl-diskless-sync-delay", "0")
        link = TcpProxy([("127.0.0.1", primary.ports[0])]).start()
        host, port = ("127.0.0.1", primary.ports[0]) if direct else link.address
        redis_command(replica.ports[0], "REPLICAOF", host, str(port))
        pair = ReplicatedPair(primary, replica, link)
        pair.wait_in_sync()
    except BaseException:
        if link is not None:
            link.stop()
        if replica is not None:
            replica.stop()
        primary.stop()
        raise
    return pair


def _info(port: int, section: str) -> dict[str, str]:
    reply = redis_command(port, "INFO", section)
    if not isinstance(reply, bytes):
        raise ConnectionError(f"unexpected INFO reply: {reply!r}")
    out: dict[str, str] = {}
    for line in reply.decode().splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out

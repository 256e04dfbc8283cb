"""The wire: how one backend's commands reach Redis, chosen once per client.

Every transport answers the same small protocol (:class:`Wire`), so no caller
asks which one it has:

* :class:`.direct.DirectWire`, for a plain client over redis-py's own
  connections (one server, or its master behind Sentinel): everything by
  hand, which costs a fraction of redis-py's own path. Its parts, by role:
  :mod:`.packets` (the Redis protocol), :mod:`.exchange` (one packet out, its
  replies read from the connection's hiredis reader under one timer),
  :mod:`.pool` (connections kept between calls, over redis-py's pool),
  :mod:`.batching` (calls ready together sent as one packet);
* :class:`.routing.ClusterWire`, for a cluster client: a resume's read by
  hand to the master of its slot, everything else through redis-py;
* :class:`.public.PublicWire`, for everything else (fakes, connection
  classes of an application's own): redis-py's public API.

The hand-made paths use names of redis-py that are not its public API,
listed and checked in :mod:`..redispy`: if one is missing, every client goes
through redis-py's public API instead (slower, same results), with one
:class:`RuntimeWarning` naming what is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster

from ..redispy import BY_HAND, OWN_CONNECTIONS
from .batching import SHARED_BYTES, SHARED_CALLS
from .direct import DirectWire
from .packets import Commands, pack_args, pack_one
from .public import PublicWire
from .routing import ClusterWire

__all__ = [
    "BY_HAND",
    "SHARED_BYTES",
    "SHARED_CALLS",
    "ClusterWire",
    "Commands",
    "DirectWire",
    "PublicWire",
    "Transactions",
    "Wire",
    "pack_args",
    "pack_one",
    "talks_to_one_server",
    "wire_for",
]


class Transactions(Protocol):
    """A transport that holds a connection between two packets: an optimistic transaction."""

    async def watched(
        self, reads: bytes, replies: int, then: Callable[[list[Any]], tuple[bytes, int]]
    ) -> list[Any]:
        """``reads`` (starting with a ``WATCH``), then the packet ``then`` builds from their
        replies (ending the watch), on one connection; the second packet's replies."""
        ...

    def held(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Count a caller as in flight while it waits on a transaction another call sends."""
        ...


class Wire(Protocol):
    """How one backend's commands reach Redis. Replies as Redis sent them; in a list of
    replies, an error reply is a value; a single command's error reply is raised."""

    client: Any

    @property
    def transactions(self) -> Transactions | None:
        """Optimistic transactions, where this transport holds a connection between two
        packets; else None (a failure's teardown is then a script)."""
        ...

    async def command(self, command: tuple[Any, ...]) -> Any:
        """One command; its reply."""
        ...

    async def call(self, packet: bytes, command: Callable[[], Sequence[Any]]) -> Any:
        """One command, given both packed (``packet``, sent as is where the transport packs
        by hand) and as a builder of its arguments (called where it does not)."""
        ...

    async def pipeline(
        self, commands: Sequence[tuple[Any, ...]], *, slack: float = 0.0
    ) -> list[Any]:
        """Commands in one packet on one connection; their replies in order.

        ``slack``: how long a command may block in Redis beyond the socket
        timeout (a ``WAIT``), added to the replies' timer.
        """
        ...

    async def shared_pipeline(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """As :meth:`pipeline`, in a packet other calls ready at the same moment may share.

        Only for commands that leave the connection as they found it.
        """
        ...

    async def keyless(self, commands: Sequence[tuple[Any, ...]]) -> None:
        """Commands that name no key (``PUBLISH``), sent for their effect: in one packet where
        the transport can, else one at a time (a cluster routes a pipeline by keys)."""
        ...

    def read(
        self, key: str, packet: bytes, replies: int, commands: Commands
    ) -> Awaitable[list[Any]]:
        """Reads on ``key``'s slot, shared with the other reads ready at the same moment where
        the transport can; given both packed and as a builder of the commands."""
        ...

    async def give_back(self) -> None:
        """Every connection kept back to the client's pool (the backend's close calls this)."""
        ...


def talks_to_one_server(client: Any) -> bool:
    """A plain client whose pool opens redis-py's own connections to one real server."""
    pool = getattr(client, "connection_pool", None)
    return (
        isinstance(client, Redis)
        and isinstance(pool, ConnectionPool)
        and getattr(pool, "connection_class", None) in OWN_CONNECTIONS
    )


def wire_for(client: Any) -> Wire:
    """The transport for ``client``: by hand where redis-py allows it (see the module)."""
    if BY_HAND and talks_to_one_server(client):
        return DirectWire(client)
    if BY_HAND and isinstance(client, RedisCluster):
        return ClusterWire(client)
    return PublicWire(client)

"""The transport of a cluster: a resume's read by hand to the master of its slot, else redis-py.

On a cluster, redis-py's pipeline costs a resume's read several times its own
work in client time; the read is one packet to the master redis-py's slot map
names for its key, shared with the other reads for that master that are ready
at the same moment (:mod:`.batching`). Everything else goes through redis-py
(:class:`.public.PublicWire`), which follows redirections and refreshes its map.
"""

from __future__ import annotations

import contextlib
from typing import Any

from redis.exceptions import (
    AskError,
    ClusterDownError,
    RedisClusterException,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..redispy import OWN_CONNECTIONS
from . import exchange
from .batching import Batcher
from .packets import Commands
from .public import PublicWire

__all__ = ["ClusterWire"]

#: Replies of a master that does not (or not yet) serve a key's slot: MOVED,
#: ASK, TRYAGAIN, CLUSTERDOWN. redis-py's cluster client follows them.
_REDIRECTED = (AskError, ClusterDownError, TryAgainError)


class ClusterWire(PublicWire):
    """A cluster client's transport: reads by hand to the slot's master (see the module)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.in_flight = 0  # reads between taking a master's connection and giving it back
        self._batch = Batcher(self)
        self._deadlines = exchange.Deadlines()  # the timers of its exchanges

    async def read(self, key: str, packet: bytes, replies: int, commands: Commands) -> list[Any]:
        got = await self.pipelined_at(key, packet, replies)
        if got is None:  # that master could not take it: through redis-py
            got = await self.pipeline(commands())
        return got

    async def give_back(self) -> None:
        await self._batch.settle()

    async def pipelined_at(self, key: str, packet: bytes, replies: int) -> list[Any] | None:
        """A packet of reads on ``key``'s slot, by hand to the master that holds it.

        ``None`` when that master could not take it (it answered that the slot
        moved, or is not served yet; the connection failed; the map names no
        node; its node's connections are not redis-py's own): the caller then
        sends the same commands through redis-py. Only for reads, which are
        safe to send twice.
        """
        try:
            node = self.client.get_node_from_key(key)
        except (RedisClusterException, RedisConnectionError):  # no node
            return None
        if node is None or node.connection_class not in OWN_CONNECTIONS:
            return None

        async def send(packet: bytes, replies: int, gathered: bool) -> list[Any] | None:
            return await self._exchange_at(node, packet, replies)

        out: list[Any] | None = await self._batch.gather(node.name, packet, replies, send)
        return None if out is None else _unmoved(out)

    async def _exchange_at(self, node: Any, packet: bytes, replies: int) -> list[Any] | None:
        """One packet on a connection of ``node``; ``None`` if the connection failed."""
        # The client's bound on commands in flight (``client.py``'s
        # cluster client waits for a place): a connection taken here counts.
        hold = getattr(self.client, "in_flight", None)
        self.in_flight += 1
        try:
            async with hold() if hold is not None else contextlib.nullcontext():
                try:
                    conn = node.acquire_connection()
                except (RedisClusterException, RedisConnectionError):  # no connection
                    return None
                sound = False
                try:
                    out: list[Any] = await exchange.exchange(
                        conn, packet, replies, 0.0, crowded=False, deadlines=self._deadlines
                    )
                    sound = True
                except (RedisConnectionError, RedisTimeoutError):
                    return None
                finally:
                    if not sound:
                        await exchange.drop(conn)
                    node.release(conn)
                return out
        finally:
            self.in_flight -= 1


def _unmoved(replies: list[Any]) -> list[Any] | None:
    """A read's replies, or ``None`` if its master did not serve its slot (see ``_REDIRECTED``)."""
    return None if any(isinstance(reply, _REDIRECTED) for reply in replies) else replies

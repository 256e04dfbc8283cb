"""The transport of one server, by hand: packets built here, sent and read on kept connections.

For a plain client (one server, or its master behind Sentinel) whose pool
opens redis-py's own connections: commands and pipelines are sent by hand
(one packet, replies read as Redis sent them, under one timer per exchange:
:mod:`.exchange`), on a connection kept between calls while others are in
flight (:mod:`.pool`), and calls that are ready together share one packet
(:mod:`.batching`). That costs a fraction of a redis-py ``Pipeline``. It also
holds a connection between two packets, for an optimistic transaction
(:meth:`DirectWire.watched`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from . import exchange
from .batching import Batcher
from .packets import Commands, pack_one
from .pool import KeptConnections

__all__ = ["DirectWire"]


class DirectWire:
    """How one backend's commands reach one server by hand (see the module)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._pool = KeptConnections(client, self._settle)
        self._batch = Batcher(self._pool)
        self._deadlines = exchange.Deadlines()  # the timers of its exchanges
        #: This transport holds a connection between two packets (:meth:`watched`).
        self.transactions = self

    async def _settle(self) -> None:
        await self._batch.settle()

    # -- the transport (see :class:`..Wire`) ------------------------------------

    async def command(self, command: tuple[Any, ...]) -> Any:
        return await self.roundtrip(pack_one(command))

    async def call(self, packet: bytes, command: Callable[[], Sequence[Any]]) -> Any:
        return await self.roundtrip(packet)

    async def pipeline(
        self, commands: Sequence[tuple[Any, ...]], *, slack: float = 0.0
    ) -> list[Any]:
        packet = b"".join(pack_one(command) for command in commands)
        return await self.pipelined(packet, len(commands), slack=slack)

    async def shared_pipeline(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        packet = b"".join(pack_one(command) for command in commands)
        return await self.shared(packet, len(commands))

    async def keyless(self, commands: Sequence[tuple[Any, ...]]) -> None:
        await self.pipeline(commands)

    def read(
        self, key: str, packet: bytes, replies: int, commands: Commands
    ) -> Awaitable[list[Any]]:
        # A plain function handing on the coroutine of :meth:`shared` (so are
        # :meth:`shared` and :meth:`roundtrip`'s): a resume's read awaits no
        # layer of its own on the way to the connection.
        return self.shared(packet, replies)

    async def give_back(self) -> None:
        await self._pool.give_back()

    # -- packets ----------------------------------------------------------------

    async def roundtrip(self, packet: bytes) -> Any:
        """One packed command, its reply as Redis sent it (errors raised); it shares its packet
        with the other calls ready at the same moment (:meth:`shared`)."""
        (reply,) = await self._batch.gather(None, packet, 1, self._packet)
        if isinstance(reply, Exception):
            raise reply  # an error reply: the connection stayed in step
        return reply

    async def pipelined(self, packet: bytes, replies: int, *, slack: float = 0.0) -> list[Any]:
        """A packet of ``replies`` commands sent by hand; the replies in order, errors as values.

        The replies come back together (one packet in, one out), so they are
        read under one timer of the socket timeout rather than one timer each,
        which would cost more than the reads: a server that stops halfway still
        cannot hold the call longer. ``slack``: how long a command may block in
        Redis beyond the socket timeout (a ``WAIT``), added to the replies' timer.
        """
        return await self._packet(packet, replies, False, slack)

    def shared(self, packet: bytes, replies: int) -> Awaitable[list[Any]]:
        """A packet of ``replies`` commands, sent with the others ready at the same moment
        (:mod:`.batching`); replies in order, error replies as values, as :meth:`pipelined`."""
        return self._batch.gather(None, packet, replies, self._packet)

    async def _packet(
        self,
        packet: bytes,
        replies: int,
        gathered: bool = False,
        slack: float = 0.0,
        then: Callable[[list[Any]], tuple[bytes, int]] | None = None,
    ) -> list[Any]:
        """A packet on a connection of the pool (and ``then``'s on the same one, if given).

        Its first three parameters are a :data:`.batching.Send`'s: the batcher
        calls it directly.
        """
        pool = self._pool
        conn = pool.kept_one()
        if conn is None:
            conn = await pool.take()
        failed = True
        try:
            crowded = not gathered and pool.in_flight > 1  # gathered: yielded already
            out = await exchange.exchange(
                conn, packet, replies, slack, crowded=crowded, deadlines=self._deadlines
            )
            if then is not None:
                packet, count = then(out)
                crowded = pool.in_flight > 1
                out = await exchange.exchange(
                    conn, packet, count, 0.0, crowded=crowded, deadlines=self._deadlines
                )
            failed = False
        finally:
            if failed:
                await pool.lose(conn)
        if not pool.keep(conn):
            await pool.release(conn)
        return out

    # -- transactions -------------------------------------------------------------

    async def watched(
        self, reads: bytes, replies: int, then: Callable[[list[Any]], tuple[bytes, int]]
    ) -> list[Any]:
        """Two packets on one connection held between them: ``reads``, then ``then``'s.

        For an optimistic transaction: ``reads`` starts with a ``WATCH``;
        ``then`` gets its replies and returns the second packet and its reply
        count, which must end the watch (``MULTI`` ... ``EXEC``, or
        ``UNWATCH``), so that the connection goes back to the pool as it came.
        Returns the second packet's replies. A connection that fails halfway is
        dropped, and the watch ends with it.
        """
        return await self._packet(reads, replies, False, 0.0, then)

    def held(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Count a caller as in flight while it waits on something else of this backend.

        A failed resume waits for its batched teardown (another call's
        connection sends it) and then its caller goes on with the next
        resume: counted, it keeps the kept connections kept for that one.
        """
        return self._pool.held()

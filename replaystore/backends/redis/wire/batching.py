"""Calls ready at the same moment, sent as one packet: each caller gets its own replies.

While other calls are in flight, the packets of the calls that become ready in
the same event-loop iteration (up to :data:`SHARED_CALLS`, each at most
:data:`SHARED_BYTES`) go out as one packet on one connection, and each caller
gets its own slice of the replies: a storm of resumes or a burst of appends
then costs Redis one read and one write of a socket per packet instead of per
call, and the client one write. (Figures: ``docs/benchmarks.md``, "The wire's
choices".)

Only for commands that leave the connection as they found it (no ``WATCH``,
no ``WAIT``, nothing that blocks). A shared packet is sent by a task of its
own, so a caller that is cancelled does not stop the others; if it fails,
every call in it gets the same error, as each would have had on a connection
of its own that failed.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError

from ..errors import FOREIGN

__all__ = ["SHARED_BYTES", "SHARED_CALLS", "Batcher", "Busy", "Send"]

#: At most this many calls share one packet: every one of them waits for the
#: whole packet's replies, so a bound keeps a burst's first calls from waiting
#: on hundreds of others; beyond a few dozen, sharing saves little more per call.
SHARED_CALLS = 64
#: A call's packet larger than this goes alone (a large payload would make
#: the others wait for its bytes); 64 of them make at most a megabyte.
SHARED_BYTES = 16384

#: Sends one packet: ``send(packet, replies, gathered)`` returns its replies,
#: or ``None`` for a cluster's master that could not take it; ``gathered``
#: says that the call already yielded to let others join.
Send = Callable[[bytes, int, bool], Awaitable[list[Any] | None]]


class Busy(Protocol):
    """What tells whether other calls are in flight (only then is there anyone to wait for)."""

    in_flight: int


class Batcher:
    """The calls gathering for the next shared packet (per destination), the packets under way."""

    def __init__(self, busy: Busy) -> None:
        self._busy = busy
        # Per destination (None: the one server; on a cluster, a master's
        # name); the first one's place holds no future until the packet goes.
        self._gathering: dict[str | None, list[tuple[bytes, int, Any]]] = {}
        self._sending: set[asyncio.Task[None]] = set()  # shared packets under way

    def gather(self, to: str | None, packet: bytes, replies: int, send: Send) -> Awaitable[Any]:
        """``send`` this packet with the others for ``to`` ready in this event-loop iteration.

        With no other call in flight and none gathering, ``send``'s own
        coroutine, without one of this layer around it (every lone call's case).
        """
        if not self._busy.in_flight and to not in self._gathering:
            return send(packet, replies, False)  # alone: nobody to wait for
        return self._gather(to, packet, replies, send)

    async def _gather(self, to: str | None, packet: bytes, replies: int, send: Send) -> Any:
        gathering = self._gathering.get(to)
        if gathering is not None and len(gathering) < SHARED_CALLS and len(packet) <= SHARED_BYTES:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            gathering.append((packet, replies, future))
            return await future
        if not self._busy.in_flight or len(packet) > SHARED_BYTES:
            return await send(packet, replies, False)  # alone: nobody to wait for
        gathering = self._gathering[to] = [(packet, replies, None)]
        try:
            await asyncio.sleep(0)  # the calls ready in this iteration join this one
        except asyncio.CancelledError:
            del gathering[0]  # cancelled before it was sent: it is not sent; the others are
            if gathering:
                self._start_sending(gathering, send)
            raise
        finally:
            if self._gathering.get(to) is gathering:
                del self._gathering[to]
        if len(gathering) == 1:
            return await send(packet, replies, True)
        own: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        gathering[0] = (packet, replies, own)
        self._start_sending(gathering, send)
        return await own

    def _start_sending(self, gathering: list[tuple[bytes, int, Any]], send: Send) -> None:
        task = asyncio.get_running_loop().create_task(_send_gathered(gathering, send))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        task.add_done_callback(partial(_fail_gathered, gathering))

    async def settle(self) -> None:
        """Wait until the shared packets under way are answered."""
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)


async def _send_gathered(
    gathering: list[tuple[bytes, int, asyncio.Future[Any]]], send: Send
) -> None:
    """Send the gathered calls' packets as one; hand each caller its replies.

    If the send fails, :func:`_fail_gathered` hands each caller the error.
    """
    packet = b"".join([p for p, _, _ in gathering])
    out = await send(packet, sum([n for _, n, _ in gathering]), True)
    at = 0
    for _, n, future in gathering:
        if not future.done():  # a caller that gave up: none
            future.set_result(None if out is None else out[at : at + n])
        at += n


def _fail_gathered(
    gathering: list[tuple[bytes, int, asyncio.Future[Any]]], task: asyncio.Task[None]
) -> None:
    """A shared packet's send failed: each caller gets the error, as from a packet of its own
    (a send that was itself cancelled or interrupted: the connection closed under it)."""
    exc = None if task.cancelled() else task.exception()
    if exc is None and not task.cancelled():
        return  # sent and answered: each caller has its replies
    for _, _, future in gathering:
        if not future.done():
            future.set_exception(
                _again(exc)
                if isinstance(exc, Exception)
                else RedisConnectionError("the connection closed with the call on it")
            )


def _again(exc: Exception) -> Exception:
    """The same error for another caller: a copy of a store's error, so that each raise keeps
    its own traceback; anything else (a bug, whose class may not be rebuilt) as it is."""
    return copy.copy(exc) if isinstance(exc, FOREIGN) else exc

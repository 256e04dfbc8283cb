"""The live tail: one stream delivered to one connection, read from the store after each wake-up.

Whichever replica appends an event, the connection reads it from the store,
so the seam between replay and live is exact by construction, as in
centrifuge's recovery: the replica subscribes to the session's wake-ups
*first*, then resolves and replays, then registers the tail with a pending
wake-up, so anything appended after the replay's snapshot is read by the
tail's first catch-up. Every catch-up resumes from the last event read, with
the same atomic resolve as a reconnecting client: a gap that the store can no
longer fill is a failed verdict (the connection ends and the session is torn
down), never a silent skip. Wake-ups are hints: a tail also re-reads every
``check_interval`` seconds, which catches a lost notification and lets it
notice a request whose replica stopped (see :mod:`replaystore.mcp.replicas.replica`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from ...cursor import Cursor

__all__ = ["Tail"]


class Tail:
    """The live feed of one stream (a sequence of the session) to one connection.

    ``last_id`` is the last event read from the store for this connection (the
    next catch-up starts after it). The connection's writer runs inside
    :attr:`scope`, so :meth:`close` ends that connection at once (takeover,
    session end, overflow).
    """

    def __init__(self, sequence: str, last_id: str) -> None:
        self.sequence = sequence
        self.last_id = last_id
        self.token = uuid.uuid4().hex
        self.scope = anyio.CancelScope()
        self.closed = False
        #: Whether the connection's writer is inside :meth:`delivering`.
        self._delivering = False
        self._stopped = anyio.Event()
        self._wake = anyio.Event()
        self._wake.set()  # the first catch-up runs at once (see the module docstring)

    @property
    def position(self) -> int:
        return Cursor.parse(self.last_id).position

    def wake(self) -> None:
        """New events may be in the store (called from the append path or a notification)."""
        self._wake.set()

    async def wait(self, seconds: float) -> None:
        """Until woken or ``seconds`` passed; the flag is reset before the caller reads."""
        with anyio.move_on_after(seconds):
            await self._wake.wait()
        self._wake = anyio.Event()

    def advance(self, event_id: str) -> None:
        self.last_id = event_id

    @contextmanager
    def delivering(self) -> Iterator[None]:
        """The writer of this tail's connection hands events to it only inside this block.

        The block runs in :attr:`scope`: once :meth:`close` was called, a
        writer that has not entered it yet hands nothing (its first send
        is cancelled), and :meth:`stopped` returns once one inside has left.
        """
        self._delivering = True
        try:
            with self.scope:
                yield
        finally:
            self._delivering = False
            self._stopped.set()

    async def stopped(self) -> None:
        """Until this (closed) tail's writer can hand its connection nothing more."""
        if self._delivering:
            await self._stopped.wait()

    def close(self) -> None:
        """End the connection this tail feeds (idempotent, synchronous)."""
        self.closed = True
        self.scope.cancel()
        self._wake.set()

"""What this process was handed, kept to catch a store that lost acknowledged appends.

A failover to a replica that had not yet received the newest appends loses
them, and the promoted replica hands their positions out again to later
events. A cursor at a lost event is caught by its stamp (``not_retained``),
but a cursor from before the lost stretch replays a chain that looks whole,
with a gap in it. The store cannot tell; the processes that were handed the
lost positions can: within one incarnation of a session the high-water only
rises, so a high-water below a position this process was handed proves the
loss. Each append sends its session's fence (the epoch and the newest
position handed out here), and the append script refuses to store anything
behind it; each resume compares the high-water it read with the fence taken
before the read. Either one ends the session for every replica with the
verdict ``store_regressed``. After a lost connection (how a failover looks
from here) every fence is checked at once (:func:`behind`), so a session this
process wrote to and does not touch again is ended too, not left for a
replica that was handed none of the lost positions to resume into.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from ...errors import StorageError
from ...verdicts import Resumption, Verdict

__all__ = ["FENCES", "Fences", "behind", "end_every", "regressed", "regressed_answer"]

logger = logging.getLogger(__name__)

#: Sessions whose fence a process remembers, the most recently appended to;
#: an older one is forgotten and its session no longer checked by this process.
FENCES = 65_536


class Fences:
    """Per session, the epoch and the highest position this process was handed."""

    __slots__ = ("_by_session", "size")

    def __init__(self, size: int = FENCES) -> None:
        self._by_session: dict[str, tuple[str, int]] = {}
        self.size = size

    def get(self, session: str) -> tuple[str, int] | None:
        return self._by_session.get(session)

    def packed(self, session: str) -> bytes:
        """The fence an append sends: ``b""``, or the epoch followed by the position."""
        fence = self._by_session.get(session)
        return b"" if fence is None else b"%s%d" % (fence[0].encode(), fence[1])

    def handed(self, session: str, epoch: str, position: int) -> None:
        """Remember ``position`` as handed out in ``session`` (most recent last, bounded)."""
        by_session = self._by_session
        old = by_session.pop(session, None)
        if old is not None and old[0] == epoch and old[1] > position:
            position = old[1]
        by_session[session] = (epoch, position)
        if len(by_session) > self.size:
            del by_session[next(iter(by_session))]

    def forget(self, session: str) -> None:
        self._by_session.pop(session, None)

    def sessions(self) -> list[tuple[str, str, int]]:
        """Every remembered fence: session, epoch, position."""
        return [(s, e, p) for s, (e, p) in self._by_session.items()]


#: Sessions read per round trip by :func:`behind`.
_BATCH = 500


async def behind(
    fences: Fences,
    client: Any,
    meta_key: Callable[[str], str],
    end: Callable[[str, str], Awaitable[None]],
) -> list[str]:
    """End, through ``end(session, epoch)``, every session whose high-water is below its fence.

    ``client`` is the redis-py client (a cluster's pipeline splits by node);
    the fences are taken before the reads, so a high-water read below one is
    a loss, whatever this process appends meanwhile. Returns the sessions ended.
    """
    held = fences.sessions()
    ended: list[str] = []
    for start in range(0, len(held), _BATCH):
        batch = held[start : start + _BATCH]
        async with client.pipeline(transaction=False) as pipe:
            for session, _, _ in batch:
                pipe.hmget(meta_key(session), "epoch", "top")
            replies = await pipe.execute()
        for (session, epoch, position), (stored, top) in zip(batch, replies, strict=True):
            if stored is None or top is None or stored.decode() != epoch:
                continue  # gone, or another incarnation: nothing of it was handed here
            if int(top) < position:
                await end(session, epoch)
                ended.append(session)
    return ended


async def end_every(fences: Fences, end: Callable[[str, str], Awaitable[None]]) -> None:
    """End, through ``end(session, epoch)``, every session with a fence: the store went back
    in time (:mod:`.marker`), so whatever this process appended may be lost."""
    for session, epoch, _ in fences.sessions():
        try:
            await end(session, epoch)
        except StorageError as exc:  # its record is refused when read, by era
            logger.warning("session %s could not be ended: %s", session, exc)


def regressed(out: Resumption, fence: tuple[str, int] | None) -> bool:
    """Whether ``out`` read a high-water below ``fence`` (taken before the read) in its epoch.

    A verdict that already tore the session down stands as it is.
    """
    evidence = out.evidence
    return not (
        fence is None
        or evidence.epoch != fence[0]
        or evidence.high_water is None
        or evidence.high_water >= fence[1]
        or evidence.torn_down
    )


def regressed_answer(out: Resumption, torn_down: bool) -> Resumption:
    """``out`` answered as ``store_regressed``, nothing replayed."""
    evidence = replace(out.evidence, reason="store_regressed", torn_down=torn_down, replayed=None)
    return Resumption(Verdict.STORE_REGRESSED, evidence, out.sequence)

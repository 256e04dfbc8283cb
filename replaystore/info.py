"""Read-only snapshots of a session's bookkeeping, for operators and tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cursor import Cursor

__all__ = ["SequenceInfo", "SessionInfo"]


@dataclass(frozen=True, slots=True)
class SequenceInfo:
    """One event sequence (an SSE stream) of a session.

    ``floor`` is the lowest retained position of this sequence, ``high_water``
    its highest issued position, ``retained`` how many of its events are kept.
    A sequence whose events have all been evicted is still listed, with
    ``retained == 0`` and ``floor == high_water + 1``: a client holding its
    newest event missed nothing and resumes exactly. A session remembers the
    newest :data:`~replaystore.retention.EVICTED_SEQUENCES` of these.
    """

    floor: int
    high_water: int
    retained: int


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session incarnation.

    ``floor`` is the lowest retained position (``high_water + 1`` when nothing
    is retained), ``high_water`` the last position issued. Positions start at 1.
    """

    session: str
    epoch: str
    floor: int
    high_water: int
    retained: int
    sequences: dict[str, SequenceInfo] = field(default_factory=dict)

    @property
    def origin(self) -> Cursor:
        """The cursor "before the first event": resuming from it replays everything.

        Pass it to :meth:`ReplayBuffer.resolve_and_replay` as it is (or as
        ``str(info.origin)``), with the sequence name when the session has more
        than one sequence.
        """
        return Cursor(self.epoch, 0)

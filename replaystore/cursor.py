"""The cursor codec: the event id a client echoes back as ``Last-Event-ID``.

A cursor names *one incarnation of one session* (the epoch, a random token
minted when the session is created) and *one position* in that session's
single position space. Both halves are needed: a bare position such as the
seed's ``4471`` cannot prove which incarnation issued it, so after a restart,
a teardown or behind a proxy that mixes sessions it could silently point at a
different event. The string form is ``<epoch>-<position>``, for example
``3f9a1c0b7d2e-4471``: short, ASCII, and never containing CR, LF or NUL, so it
is always a valid SSE ``id:`` field.

Position ``0`` is the *origin*: "before the first event of this incarnation".
It is never handed out as an event id; :meth:`SessionInfo.origin` gives it to a
caller who wants a session's whole history.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

__all__ = [
    "EPOCH_LENGTH",
    "MAX_CURSOR_LENGTH",
    "MAX_POSITION",
    "Cursor",
    "CursorError",
    "new_epoch",
]

#: Hex digits in an epoch (48 random bits: collisions between incarnations of
#: one session id are what the epoch rules out, and 2**-48 is far enough).
EPOCH_LENGTH = 12
#: The largest position a cursor may carry. Positions are also handled by Lua
#: inside Redis, where numbers are doubles printed with 14 significant digits,
#: so they stay below 10**14 (a hundred trillion events per session).
MAX_POSITION = 10**14 - 1
#: Anything longer is rejected before any regular expression runs on it.
MAX_CURSOR_LENGTH = EPOCH_LENGTH + 1 + 14

_CURSOR_RE = re.compile(rf"([0-9a-f]{{{EPOCH_LENGTH}}})-(0|[1-9][0-9]{{0,13}})")
_EPOCH_RE = re.compile(rf"[0-9a-f]{{{EPOCH_LENGTH}}}")


class CursorError(ValueError):
    """A string that is not a replaystore cursor."""


def new_epoch() -> str:
    """Mint a fresh epoch for a new session incarnation."""
    return secrets.token_hex(EPOCH_LENGTH // 2)


@dataclass(frozen=True, slots=True, order=True)
class Cursor:
    """A parsed event id: which session incarnation, which position."""

    epoch: str
    position: int

    def __post_init__(self) -> None:
        if not isinstance(self.epoch, str) or not _EPOCH_RE.fullmatch(self.epoch):
            raise CursorError(f"epoch must be {EPOCH_LENGTH} lowercase hex digits")
        if (
            not isinstance(self.position, int)
            or isinstance(self.position, bool)
            or not 0 <= self.position <= MAX_POSITION
        ):
            raise CursorError(f"position must be an integer in [0, {MAX_POSITION}]")

    @classmethod
    def parse(cls, value: object) -> Cursor:
        """Parse an event id; raise :class:`CursorError` for anything else.

        Strict on purpose: no whitespace trimming, no leading zeros, no bare
        integers. Two spellings of one cursor would let a proxy or a client
        library "normalise" an id into another one.
        """
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                raise CursorError("cursor is not ASCII") from None
        if not isinstance(value, str):
            raise CursorError(f"cursor must be a string, not {type(value).__name__}")
        if len(value) > MAX_CURSOR_LENGTH:
            raise CursorError(f"cursor longer than {MAX_CURSOR_LENGTH} characters")
        match = _CURSOR_RE.fullmatch(value)
        if match is None:
            raise CursorError("cursor is not of the form <epoch>-<position>")
        position = int(match.group(2))
        if position > MAX_POSITION:
            raise CursorError(f"cursor position above {MAX_POSITION}")
        return cls(match.group(1), position)

    @classmethod
    def try_parse(cls, value: object) -> Cursor | None:
        """Like :meth:`parse`, but ``None`` instead of an exception."""
        try:
            return cls.parse(value)
        except CursorError:
            return None

    def __str__(self) -> str:
        return f"{self.epoch}-{self.position}"

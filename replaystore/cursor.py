"""The cursor codec: the event id a client echoes back as ``Last-Event-ID``.

A cursor names *one incarnation of one session* (the epoch, a random token
minted when the session is created) and *one position* in that session's
single position space. Both halves are needed: a bare position such as
``4471`` cannot prove which incarnation issued it, so after a restart, a
teardown or behind a proxy that mixes sessions it could silently point at a
different event.

Event ids also carry a *hint*: the event's sequence tag (a hash of the
sequence name), its ordinal within that sequence, and its stamp (the
server's clock, in milliseconds, when it was stored). The tag and the
ordinal let a backend read the missed events of the sequence directly, in one
range read, instead of looking the position up first; they are never
trusted, only checked against the stored event. The stamp tells two events
apart that got the same position: after a failover to a replica that had not
received the newest events, the new primary issues those positions again,
and a cursor naming a lost event must not resume after the new one.

Spellings: ``<epoch>-<position>`` (the origin, and ids issued by earlier
versions: judged by position alone) and
``<epoch>-<position>.<tag>.<ordinal>.<stamp>``, for example
``3f9a1c0b7d2e-4471.9c1f0e2a7b3d4c5e.1088.1764694800123``: ASCII, never
containing CR, LF or NUL, so always a valid SSE ``id:`` field.

Position ``0`` is the *origin*: "before the first event of this incarnation".
It is never handed out as an event id; :meth:`SessionInfo.origin` gives it to a
caller who wants a session's whole history.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
from dataclasses import dataclass

from ._frozen import builder
from .errors import ReplayStoreError

__all__ = [
    "EPOCH_LENGTH",
    "EVENT_ID",
    "MAX_CURSOR_LENGTH",
    "MAX_POSITION",
    "TAG_LENGTH",
    "Cursor",
    "CursorError",
    "event_id",
    "event_id_format",
    "new_epoch",
    "sequence_tag",
]

#: Hex digits in an epoch (48 random bits: collisions between incarnations of
#: one session id are what the epoch rules out, and 2**-48 is far enough).
EPOCH_LENGTH = 12
#: Hex digits in a sequence tag (64 bits of a hash of the sequence name).
TAG_LENGTH = 16
#: The largest position (and ordinal) a cursor may carry. Positions are also
#: handled by Lua inside Redis, where numbers are doubles printed with 14
#: significant digits, so they stay below 10**14.
MAX_POSITION = 10**14 - 1
#: Anything longer is rejected before any regular expression runs on it.
MAX_CURSOR_LENGTH = EPOCH_LENGTH + 1 + 14 + 1 + TAG_LENGTH + 1 + 14 + 1 + 14

_NUMBER = "(0|[1-9][0-9]{0,13})"
_CURSOR_RE = re.compile(
    rf"([0-9a-f]{{{EPOCH_LENGTH}}})-{_NUMBER}"
    rf"(?:\.([0-9a-f]{{{TAG_LENGTH}}})\.{_NUMBER}\.{_NUMBER})?"
)
_EPOCH_RE = re.compile(rf"[0-9a-f]{{{EPOCH_LENGTH}}}")
_TAG_RE = re.compile(rf"[0-9a-f]{{{TAG_LENGTH}}}")

#: The id of a stored event, as a ``%`` format of (epoch, position, tag,
#: ordinal, stamp): the spelling :meth:`Cursor.parse` reads back. Every
#: backend issues ids through :func:`event_id` or :func:`event_id_format`.
EVENT_ID = "%s-%s.%s.%s.%s"


class CursorError(ReplayStoreError, ValueError):
    """A string that is not a replaystore cursor."""


def event_id(
    epoch: str, position: int | str, tag: str, ordinal: int | str, stamp: int | str
) -> str:
    """The id of one stored event.

    Numbers may come as their decimal text: a backend that reads them from
    storage as text passes them through without a round trip to ``int``.
    """
    return EVENT_ID % (epoch, position, tag, ordinal, stamp)


def event_id_format(epoch: str, tag: str) -> str:
    """:data:`EVENT_ID` with the epoch and the tag filled in.

    A ``%`` format of (position, ordinal, stamp), for a loop that spells many
    ids of one sequence: its ``__mod__`` mapped over the rows runs no Python
    code per id.
    """
    return EVENT_ID % (epoch.replace("%", "%%"), "%d", tag.replace("%", "%%"), "%d", "%s")


def new_epoch() -> str:
    """Mint a fresh epoch for a new session incarnation."""
    return secrets.token_hex(EPOCH_LENGTH // 2)


@functools.lru_cache(maxsize=4096)
def sequence_tag(sequence: str) -> str:
    """The tag of a sequence name: fixed-length, so it fits in keys and cursors.

    64 bits of BLAKE2b: two names of one session colliding is a 2**-64 event
    per pair, and the backends refuse the append if it ever happens.
    """
    return hashlib.blake2b(sequence.encode("utf-8"), digest_size=8).hexdigest()


def _is_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_POSITION


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class Cursor:
    """A parsed event id: which session incarnation, which position (and the hint)."""

    epoch: str
    position: int
    tag: str | None = None
    ordinal: int | None = None
    stamp: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.epoch, str) or not _EPOCH_RE.fullmatch(self.epoch):
            raise CursorError(f"epoch must be {EPOCH_LENGTH} lowercase hex digits")
        if not _is_number(self.position):
            raise CursorError(f"position must be an integer in [0, {MAX_POSITION}]")
        if not (self.tag is None) == (self.ordinal is None) == (self.stamp is None):
            raise CursorError("a hint needs the sequence tag, the ordinal and the stamp")
        if self.tag is not None:
            if not isinstance(self.tag, str) or not _TAG_RE.fullmatch(self.tag):
                raise CursorError(f"tag must be {TAG_LENGTH} lowercase hex digits")
            if not _is_number(self.ordinal) or not _is_number(self.stamp):
                raise CursorError(f"ordinal and stamp must be integers in [0, {MAX_POSITION}]")
            if self.position == 0:
                raise CursorError("the origin carries no hint")

    @classmethod
    def parse(cls, value: object) -> Cursor:
        """Parse an event id; raise :class:`CursorError` for anything else.

        Strict on purpose: no whitespace trimming, no leading zeros, no bare
        integers. Two spellings of one cursor text would let a proxy or a
        client library "normalise" an id into another one.
        """
        parsed = _parse(value) if cls is Cursor else _parse_as(cls, value)
        if isinstance(parsed, str):
            raise CursorError(parsed)
        return parsed

    @classmethod
    def try_parse(cls, value: object) -> Cursor | None:
        """Like :meth:`parse`, but ``None`` instead of an exception."""
        parsed = _parse(value) if cls is Cursor else _parse_as(cls, value)
        return None if isinstance(parsed, str) else parsed

    def _key(self) -> tuple[str, int, str, int, int]:
        return (
            self.epoch,
            self.position,
            self.tag or "",
            -1 if self.ordinal is None else self.ordinal,
            -1 if self.stamp is None else self.stamp,
        )

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Cursor):
            return NotImplemented
        return self._key() < other._key()

    @property
    def bare(self) -> Cursor:
        """The same cursor without its hint (what the verdict is decided on)."""
        return _build(self.epoch, self.position, None, None, None)

    def __str__(self) -> str:
        tag, ordinal, stamp = self.tag, self.ordinal, self.stamp
        if tag is None or ordinal is None or stamp is None:
            return f"{self.epoch}-{self.position}"
        return event_id(self.epoch, self.position, tag, ordinal, stamp)


#: A cursor from fields known good, without ``__post_init__`` (see :mod:`._frozen`).
_build = builder(Cursor)

_FORM = "cursor is not of the form <epoch>-<position>[.<tag>.<ordinal>.<stamp>]"


def _parse(value: object) -> Cursor | str:
    """A cursor, or why ``value`` is not one (a message, not an exception: ``try_parse``
    of a bad id raises nothing).

    The pattern proves every field (lowercase hex of the right length, decimal
    numbers without a sign or a leading zero, at most 14 digits), so the
    fields go into the cursor without its constructor's checks; only "the
    origin carries no hint" is left to check here.
    """
    if type(value) is not str:
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                return "cursor is not ASCII"
        elif not isinstance(value, str):
            return f"cursor must be a string, not {type(value).__name__}"
    if len(value) > MAX_CURSOR_LENGTH:
        return f"cursor longer than {MAX_CURSOR_LENGTH} characters"
    match = _CURSOR_RE.fullmatch(value)
    if match is None:
        return _FORM
    epoch, position, tag, ordinal, stamp = match.groups()
    if tag is None:
        return _build(epoch, int(position), None, None, None)
    if position == "0":
        return "the origin carries no hint"
    return _build(epoch, int(position), tag, int(ordinal), int(stamp))


def _parse_as(cls: type[Cursor], value: object) -> Cursor | str:
    """:func:`_parse` for a subclass: built by its own constructor."""
    parsed = _parse(value)
    if isinstance(parsed, str):
        return parsed
    return cls(parsed.epoch, parsed.position, parsed.tag, parsed.ordinal, parsed.stamp)

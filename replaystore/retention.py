"""Retention settings and input limits: how much is kept, how long, how big.

Kept in one place because every backend enforces the same numbers, and because
the verdicts depend on them: a floor only moves because of these settings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import InvalidInputError

__all__ = [
    "EVICTED_SEQUENCES",
    "IDEMPOTENCY_KEYS",
    "MAX_BATCH",
    "MAX_NAME_BYTES",
    "Retention",
    "check_idempotency_key",
    "check_payloads",
    "check_sequence",
    "check_session",
    "is_valid_sequence",
    "is_valid_session",
    "run_split_ms",
]

#: Longest session id or sequence name, in UTF-8 bytes.
MAX_NAME_BYTES = 256
#: Most events one batch append may carry.
MAX_BATCH = 10_000
#: Idempotency keys remembered per session: at least this many of the newest
#: (at most twice as many), for as long as the session lives.
IDEMPOTENCY_KEYS = 1000
#: Sequences whose events were all evicted, remembered per session (the ones
#: emptied last): their state proves that a client holding a sequence's newest
#: event missed nothing. Beyond this many, the oldest is forgotten and a resume
#: from it fails closed (``below_floor``). A bound, because every request of an
#: MCP session is a sequence of its own.
EVICTED_SEQUENCES = 1000
#: With an age limit, events are aged by the start of their run (a stretch of
#: consecutive positions of one sequence); a run is closed after this fraction
#: of ``max_age``, so an event is evicted at most ``max_age / 64`` early.
_RUN_SPLIT = 64


@dataclass(frozen=True, slots=True)
class Retention:
    """How much of a session's history is kept.

    - ``max_events``: events kept per session; the oldest is evicted first,
      whatever its sequence (a count-based ring buffer over the session).
    - ``max_age``: seconds an event is kept (``None``: no age limit).
    - ``session_ttl``: seconds a session lives without an append or a resolve.
    - ``tombstone_ttl``: seconds the reason for a teardown stays readable.
    - ``max_payload``: largest payload, in bytes.
    """

    max_events: int = 10_000
    max_age: float | None = None
    session_ttl: float = 86_400.0
    tombstone_ttl: float = 3_600.0
    max_payload: int = 1 << 20

    def __post_init__(self) -> None:
        if isinstance(self.max_events, bool) or not isinstance(self.max_events, int):
            raise InvalidInputError("max_events must be an integer")
        if not 1 <= self.max_events <= 10_000_000:
            raise InvalidInputError("max_events must be in [1, 10_000_000]")
        timed = ("session_ttl", "tombstone_ttl", "max_age")
        for name in (n for n in timed if getattr(self, n) is not None):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise InvalidInputError(f"{name} must be a number of seconds")
            if not math.isfinite(value) or value < 0.001:
                raise InvalidInputError(f"{name} must be a finite number of seconds >= 0.001")
        if not isinstance(self.max_payload, int) or not 1 <= self.max_payload <= 64 << 20:
            raise InvalidInputError("max_payload must be in [1, 64 MiB]")

    @property
    def max_age_ms(self) -> int:
        """``max_age`` in whole milliseconds, 0 for none (the form Lua reads)."""
        return 0 if self.max_age is None else max(1, round(self.max_age * 1000))

    @property
    def session_ttl_ms(self) -> int:
        return max(1, round(self.session_ttl * 1000))

    @property
    def tombstone_ttl_ms(self) -> int:
        return max(1, round(self.tombstone_ttl * 1000))


def run_split_ms(retention: Retention) -> int:
    """How long a run of one sequence may grow before a new one starts (0: no age limit)."""
    max_age_ms = retention.max_age_ms
    return max(1, max_age_ms // _RUN_SPLIT) if max_age_ms else 0


def is_valid_session(session: object) -> bool:
    """Session ids are 1..256 visible ASCII characters (what MCP allows in ``Mcp-Session-Id``)."""
    return isinstance(session, str) and _SESSION_ID.fullmatch(session) is not None


# Checked on every call: a regular expression, since it is much cheaper than a
# loop over the characters (``docs/benchmarks.md``).
_SESSION_ID = re.compile(f"[\\x21-\\x7e]{{1,{MAX_NAME_BYTES}}}")


def is_valid_sequence(sequence: object) -> bool:
    """Sequence names are non-empty text of at most 256 UTF-8 bytes, without NUL."""
    if not isinstance(sequence, str) or not sequence or "\x00" in sequence:
        return False
    try:
        return len(sequence.encode("utf-8")) <= MAX_NAME_BYTES
    except UnicodeEncodeError:  # lone surrogates
        return False


def check_session(session: object) -> str:
    if not is_valid_session(session):
        raise InvalidInputError(
            f"session id must be 1..{MAX_NAME_BYTES} visible ASCII characters, got {_show(session)}"
        )
    assert isinstance(session, str)
    return session


def check_sequence(sequence: object) -> str:
    if not is_valid_sequence(sequence):
        raise InvalidInputError(
            f"sequence must be non-empty text of at most {MAX_NAME_BYTES} UTF-8 bytes without NUL, "
            f"got {_show(sequence)}"
        )
    assert isinstance(sequence, str)
    return sequence


def check_idempotency_key(key: object) -> str | None:
    """Idempotency keys follow the rules of sequence names (``None``: no key)."""
    if key is None:
        return None
    if not is_valid_sequence(key):
        raise InvalidInputError(
            f"idempotency_key must be non-empty text of at most {MAX_NAME_BYTES} UTF-8 bytes "
            f"without NUL, got {_show(key)}"
        )
    assert isinstance(key, str)
    return key


def check_payloads(payloads: Sequence[bytes | None], retention: Retention) -> None:
    """Refuse the whole batch before anything is stored if any payload is bad."""
    if len(payloads) > MAX_BATCH:
        raise InvalidInputError(f"a batch holds at most {MAX_BATCH} events, got {len(payloads)}")
    for index, payload in enumerate(payloads):
        if payload is None:
            continue
        if not isinstance(payload, bytes):
            raise InvalidInputError(
                f"payload {index} must be bytes or None, not {type(payload).__name__}"
            )
        if len(payload) > retention.max_payload:
            raise InvalidInputError(
                f"payload {index} is {len(payload)} bytes, "
                f"above max_payload={retention.max_payload}"
            )


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

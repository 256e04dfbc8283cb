"""Exceptions raised by replaystore.

Resumption failures are *verdicts*, not exceptions: :meth:`ReplayBuffer.resolve_and_replay`
returns them. Exceptions are for calls a caller got wrong (bad names, oversized
payloads, a session that does not exist when appending) and for a store that
failed. For callers who prefer raising, :class:`~replaystore.ResumptionDesyncError`
carries a verdict; it lives beside the verdicts (``replaystore/verdicts.py``),
since it is built from one.

Every exception replaystore raises on purpose derives from
:class:`ReplayStoreError`, so one ``except`` clause catches them all. This
module imports nothing else of the package, not even for annotations, so
every other module can import it.
"""

from __future__ import annotations

__all__ = [
    "IdempotencyKeyReusedError",
    "InvalidInputError",
    "ReplayStoreError",
    "SequenceTagCollisionError",
    "StorageError",
    "StoreRegressedError",
    "UnknownSessionError",
    "UnsupportedURLError",
]


class ReplayStoreError(Exception):
    """Base class of every exception replaystore raises on purpose."""


class InvalidInputError(ReplayStoreError, ValueError):
    """A name, payload or count outside the documented limits; nothing was stored."""


class SequenceTagCollisionError(InvalidInputError):
    """Another sequence of the session has the same tag as this name; nothing was stored.

    Keys and event ids carry a sequence's tag (64 bits of a hash of its name),
    not the name, so two names of one session must not share one. That
    happens about once in 2**64 pairs of names; another name stores fine.
    """

    def __init__(self, sequence: str) -> None:
        super().__init__(
            f"sequence {sequence!r} has the tag of another sequence of this session: "
            "use another name"
        )
        self.sequence = sequence


class IdempotencyKeyReusedError(InvalidInputError):
    """The idempotency key was used in this session for a batch of another length.

    A key stands for one batch: a retry sends the same events again and gets
    the ids of the first attempt. A batch of another length under that key
    cannot be a retry (the first attempt's ids do not fit it), so nothing was
    stored. The key, not the content, identifies a batch: one of the same
    length is taken for a retry.
    """

    def __init__(self, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was already used in this session for another batch"
        )
        self.key = key


class UnknownSessionError(ReplayStoreError, LookupError):
    """The session does not exist (never opened, expired, closed or torn down)."""

    def __init__(self, session: str) -> None:
        super().__init__(f"unknown session {session!r}")
        self.session = session


class StoreRegressedError(UnknownSessionError):
    """The store lost appends it had acknowledged, so the session was ended.

    Raised by an append that finds the session's high-water below a position
    this process was handed earlier in the same incarnation: the store (a
    replica promoted before it received them) would issue those positions
    again to other events. The session is torn down for every replica with
    the verdict ``store_regressed``, and its clients must start a new one.
    """

    def __init__(self, session: str) -> None:
        super().__init__(session)
        self.args = (
            f"session {session!r} ended: the store lost appends it had acknowledged "
            "(a failover to a replica that had not received them)",
        )


class StorageError(ReplayStoreError):
    """The storage server could not be reached or answered with an error.

    Nothing is known about the verdict: callers must not treat it as a
    success (an HTTP layer answers 503, not an empty 200).

    ``kind`` says what happened, in one word: ``"unreachable"`` (no answer in
    time, a refused or lost connection) or what the server answered:
    ``"oom"`` (out of memory, writes refused), ``"readonly"`` (a read-only
    replica), ``"noperm"`` (forbidden by the server's ACL), ``"misconf"``
    (writes refused: the server cannot persist), ``"loading"``, ``"busy"``
    (a long script), ``"unreplicated"`` (an append stored, but acknowledged
    by fewer replicas than ``wait_replicas`` asks for), ``"error"`` (any
    other error reply). ``permanent`` is
    true when waiting cannot help (a command, key or channel the ACL
    forbids): an operator has to change the server's configuration.
    """

    def __init__(self, message: str, *, kind: str = "unreachable", permanent: bool = False):
        super().__init__(message)
        self.kind = kind
        self.permanent = permanent


class UnsupportedURLError(ReplayStoreError, ValueError):
    """No backend is registered for the URL's scheme, or the URL is malformed."""

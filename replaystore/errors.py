"""Exceptions raised by replaystore.

Resumption failures are *verdicts*, not exceptions: :meth:`ReplayBuffer.resolve_and_replay`
returns them. Exceptions are for calls a caller got wrong (bad names, oversized
payloads, a session that does not exist when appending) and for callers who
prefer raising (:class:`ResumptionDesyncError`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .verdicts import Resumption, Verdict

__all__ = [
    "InvalidInputError",
    "ReplayStoreError",
    "ResumptionDesyncError",
    "StorageError",
    "UnknownSessionError",
    "UnsupportedURLError",
]


class ReplayStoreError(Exception):
    """Base class of every exception replaystore raises on purpose."""


class InvalidInputError(ReplayStoreError, ValueError):
    """A name, payload or count outside the documented limits; nothing was stored."""


class UnknownSessionError(ReplayStoreError, LookupError):
    """The session does not exist (never opened, expired, closed or torn down)."""

    def __init__(self, session: str) -> None:
        super().__init__(f"unknown session {session!r}")
        self.session = session


class StorageError(ReplayStoreError):
    """The storage server could not be reached or answered with an error.

    Nothing is known about the verdict: callers must not treat it as a
    success (an HTTP layer answers 503, not an empty 200).
    """


class UnsupportedURLError(ReplayStoreError, ValueError):
    """No backend is registered for the URL's scheme, or the URL is malformed."""


class ResumptionDesyncError(ReplayStoreError, RuntimeError):
    """A ``Last-Event-ID`` could not be proven continuous with the retained log.

    Carries the :class:`Resumption` so the verdict and its evidence travel with it.
    """

    def __init__(self, resumption: Resumption) -> None:
        evidence = resumption.evidence
        super().__init__(f"{resumption.verdict.value}: {evidence.reason}")
        self.resumption = resumption

    @property
    def verdict(self) -> Verdict:
        return self.resumption.verdict

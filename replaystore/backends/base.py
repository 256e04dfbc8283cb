"""The contract every storage backend implements.

Deliberately narrow (five operations) so that each one can be a single atomic
step on the server: one Lua script or one pipelined read per operation on
Redis, one uninterrupted stretch of synchronous code in memory.
Input validation and cursor parsing happen once, in
:class:`replaystore.ReplayBuffer`, before a backend is called; a backend
receives well-formed names and a parsed cursor (``None`` when the text was not
a cursor, which still has to be judged against the session so that the session
can be torn down atomically).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from ..cursor import Cursor
from ..info import SessionInfo
from ..retention import Retention
from ..verdicts import Resumption

__all__ = ["Backend"]


class Backend(ABC):
    """A place to keep session event logs.

    Subclasses set ``schemes`` and are registered with
    :func:`replaystore.backends.register_backend` so that
    :meth:`ReplayBuffer.from_url` can find them. Optional capabilities are
    declared apart from these operations: replica coordination, which MCP
    replicas need, in :mod:`replaystore.backends.coordination`.
    """

    schemes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, retention: Retention) -> None:
        self.retention = retention

    @classmethod
    @abstractmethod
    def from_url(cls, url: str, retention: Retention, **options: Any) -> Backend:
        """Build the backend a URL names; unknown options raise :class:`UnsupportedURLError`."""

    async def connect(self) -> None:  # noqa: B027 - optional hook
        """Prepare connections (optional; operations connect lazily anyway)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections. The stored data is untouched."""

    @abstractmethod
    async def open_session(self, session: str) -> SessionInfo:
        """Create the session with a fresh epoch, or refresh a live one (idempotent)."""

    @abstractmethod
    async def append(
        self,
        session: str,
        sequence: str,
        payloads: Sequence[bytes | None],
        *,
        idempotency_key: str | None = None,
    ) -> list[str]:
        """Store ``payloads`` in order; return their event ids (cursor strings).

        Raises :class:`UnknownSessionError` when the session does not exist
        (appending never resurrects a torn-down session). With an
        ``idempotency_key`` already used in this session, nothing is stored and
        the ids of that earlier append come back.
        """

    @abstractmethod
    async def resolve(
        self,
        session: str,
        cursor: Cursor | None,
        raw_cursor: str,
        sequence: str | None,
        *,
        replay: bool,
        teardown: bool,
    ) -> Resumption:
        """Judge ``cursor`` against the session in one atomic step.

        With ``replay`` the missed events come back with a ``resumed`` verdict,
        and a failed verdict tears the session down when ``teardown`` is set.
        Without ``replay`` nothing is changed and no events are returned.
        """

    @abstractmethod
    async def session_info(self, session: str) -> SessionInfo | None:
        """A snapshot of the session, ``None`` when it does not exist."""

    @abstractmethod
    async def close_session(self, session: str, *, tombstone_ttl: float | None = None) -> bool:
        """Delete the session, leaving a ``closed`` tombstone; ``False`` if it did not exist.

        The tombstone stays readable ``tombstone_ttl`` seconds, the
        retention's ``tombstone_ttl`` unless given (a throwaway session's
        needs a moment only).
        """

"""``ReplayBuffer``: the one object applications talk to.

It validates input, parses cursors and formats event ids, then hands each call
to a backend as a single atomic operation. Everything that decides a verdict
happens inside the backend, in that one step, so every replica that shares a
backend reads the same verdict from the same source.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import Any

from .backends import Backend, backend_from_url
from .cursor import Cursor
from .errors import InvalidInputError
from .info import SessionInfo
from .retention import (
    Retention,
    check_idempotency_key,
    check_payloads,
    check_sequence,
    check_session,
    is_valid_sequence,
    is_valid_session,
)
from .rules import EVIDENCE_CURSOR
from .verdicts import Evidence, Resumption, Verdict, reason_text

__all__ = ["ReplayBuffer"]

# A name that can never be stored (NUL is refused in sequence names): an
# invalid sequence hint is judged as a sequence the session does not have.
_NO_SUCH_SEQUENCE = "\x00"


class ReplayBuffer:
    """Session-scoped SSE replay buffers with exact resumption or a verdict.

    >>> buf = ReplayBuffer.from_url("memory://", max_events=10_000)

    ``teardown_on_failure`` (default on) makes every failed
    :meth:`resolve_and_replay` delete the session in the same atomic step, so
    that no replica can go on serving it: the client must re-initialize.
    """

    def __init__(self, backend: Backend, *, teardown_on_failure: bool = True) -> None:
        if not isinstance(backend, Backend):
            hint = " (for a URL: ReplayBuffer.from_url(...))" if isinstance(backend, str) else ""
            raise InvalidInputError(f"ReplayBuffer needs a Backend, not {backend!r}{hint}")
        # Only a real bool: teardown_on_failure="no" would be truthy, and quietly
        # keep the teardown its caller meant to turn off.
        if not isinstance(teardown_on_failure, bool):
            raise InvalidInputError(
                f"teardown_on_failure must be True or False, not {teardown_on_failure!r}"
            )
        self.backend = backend
        self.retention = backend.retention
        self.teardown_on_failure = teardown_on_failure

    @classmethod
    def from_url(
        cls,
        url: str = "memory://",
        *,
        max_events: int = 10_000,
        max_age: float | None = None,
        session_ttl: float = 86_400.0,
        tombstone_ttl: float = 3_600.0,
        max_payload: int = 1 << 20,
        teardown_on_failure: bool = True,
        **backend_options: Any,
    ) -> ReplayBuffer:
        """Pick the backend by URL scheme (``memory://``, ``redis://``, ``redis+cluster://`` …)."""
        retention = Retention(
            max_events=max_events,
            max_age=max_age,
            session_ttl=session_ttl,
            tombstone_ttl=tombstone_ttl,
            max_payload=max_payload,
        )
        backend = backend_from_url(url, retention, **backend_options)
        return cls(backend, teardown_on_failure=teardown_on_failure)

    async def __aenter__(self) -> ReplayBuffer:
        await self.backend.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def open_session(self, session: str) -> SessionInfo:
        """Create ``session`` (fresh epoch) or refresh it if it is live."""
        return await self.backend.open_session(check_session(session))

    async def close_session(self, session: str, *, tombstone_ttl: float | None = None) -> bool:
        """Delete ``session``; resolves then get ``unknown_session`` and a ``closed`` tombstone.

        The tombstone stays ``tombstone_ttl`` seconds (the buffer's unless given).
        """
        check_session(session)
        if tombstone_ttl is None:
            return await self.backend.close_session(session)
        if not (math.isfinite(tombstone_ttl) and tombstone_ttl > 0):
            raise InvalidInputError(
                f"tombstone_ttl must be positive seconds, not {tombstone_ttl!r}"
            )
        return await self.backend.close_session(session, tombstone_ttl=tombstone_ttl)

    async def session_info(self, session: str) -> SessionInfo | None:
        if not is_valid_session(session):
            return None
        return await self.backend.session_info(session)

    async def append(
        self,
        session: str,
        sequence: str,
        payload: bytes | None,
        *,
        idempotency_key: str | None = None,
    ) -> str:
        """Store one event and return its id (a cursor string).

        ``payload=None`` stores a priming event: it takes a position, so the
        client can resume from it, and replays as an event without payload. A
        priming event right after another one of the same sequence is not
        stored again: its id is returned (see ``docs/verdicts.md``).

        ``idempotency_key`` makes a retry safe: an append whose key this
        session has already seen stores nothing and returns the ids of the
        first one (keys are remembered for the newest 1000 keyed appends at
        least, as long as the session lives).
        """
        ids = await self.append_many(session, sequence, [payload], idempotency_key=idempotency_key)
        return ids[0]

    async def append_many(
        self,
        session: str,
        sequence: str,
        payloads: Sequence[bytes | None],
        *,
        idempotency_key: str | None = None,
    ) -> list[str]:
        """Store a burst of events of one sequence in one atomic step (one round trip).

        An empty batch stores nothing and does not consult the backend.
        """
        check_session(session)
        check_sequence(sequence)
        check_idempotency_key(idempotency_key)
        payloads = list(payloads)
        check_payloads(payloads, self.retention)
        if not payloads:
            return []
        return await self.backend.append(
            session, sequence, payloads, idempotency_key=idempotency_key
        )

    async def resolve_and_replay(
        self, session: str, last_event_id: str | Cursor, sequence: str | None = None
    ) -> Resumption:
        """Judge ``last_event_id`` and, when it resumes, return exactly the missed events.

        ``last_event_id`` is an event id as a client sends it, or a
        :class:`Cursor` (:attr:`SessionInfo.origin` replays a sequence from its
        start). Never raises for bad input: any string gives a verdict. A failed
        verdict tears the session down (unless ``teardown_on_failure`` is off).
        """
        return await self._resolve(session, last_event_id, sequence, replay=True)

    async def resolve(
        self, session: str, last_event_id: str | Cursor, sequence: str | None = None
    ) -> Resumption:
        """The verdict :meth:`resolve_and_replay` would give, without replay or side effects."""
        return await self._resolve(session, last_event_id, sequence, replay=False)

    def _resolve(
        self, session: str, last_event_id: object, sequence: object, *, replay: bool
    ) -> Awaitable[Resumption]:
        """The checks of both calls, then the backend's own call handed back to be awaited:
        the usual resume goes to the backend through no coroutine of the buffer's."""
        if isinstance(last_event_id, Cursor):
            last_event_id = str(last_event_id)
        raw = last_event_id if isinstance(last_event_id, str) else repr(last_event_id)
        if not is_valid_session(session):
            evidence = Evidence(
                session=repr(session)[:64] if not isinstance(session, str) else session[:64],
                reason=reason_text("invalid_session"),
                cursor=raw[:EVIDENCE_CURSOR],
            )
            return _given(Resumption(Verdict.UNKNOWN_SESSION, evidence))
        named: str | None
        if sequence is None:
            named = None
        elif is_valid_sequence(sequence):
            assert isinstance(sequence, str)
            named = sequence
        else:
            named = _NO_SUCH_SEQUENCE
        call = self.backend.resolve(
            session,
            Cursor.try_parse(last_event_id),
            raw,
            named,
            replay=replay,
            teardown=self.teardown_on_failure,
        )
        return _placeholder_hidden(call) if named is _NO_SUCH_SEQUENCE else call


async def _given(resumption: Resumption) -> Resumption:
    return resumption


async def _placeholder_hidden(call: Awaitable[Resumption]) -> Resumption:
    """The verdict on a sequence name no sequence can have, its placeholder left out."""
    resumption = await call
    evidence = dataclasses.replace(resumption.evidence, sequence=None)
    return dataclasses.replace(resumption, sequence=None, evidence=evidence)

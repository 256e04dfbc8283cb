"""Helpers shared by the conformance tests (public API only, no backend internals)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from replaystore import Cursor, ReplayBuffer, Resumption, Verdict

MakeBuffer = Callable[..., Awaitable[ReplayBuffer]]

#: A reason that is only a short code (``"missing_event"``) instead of a sentence.
_BARE_CODE = re.compile(r"[a-z_]+")


def pos(event_id: str) -> int:
    """The position an event id carries."""
    return Cursor.parse(event_id).position


def epoch_of(event_id: str) -> str:
    return Cursor.parse(event_id).epoch


def triples(resumption: Resumption) -> list[tuple[str, str, int, bytes | None]]:
    """The replayed events as plain tuples, in the order they were returned."""
    return [(e.event_id, e.sequence, e.position, e.payload) for e in resumption.events]


def check_reason(resumption: Resumption) -> None:
    """Every verdict carries a human-readable reason (what goes into logs and 4xx bodies)."""
    reason = resumption.evidence.reason
    assert isinstance(reason, str)
    assert reason.strip(), resumption
    assert not _BARE_CODE.fullmatch(reason), f"reason is a bare code, not a sentence: {reason!r}"


def check_failed(resumption: Resumption, verdict: Verdict, *, torn_down: bool) -> None:
    """A failed verdict: right value, not ok, no events, teardown as expected."""
    assert resumption.verdict is verdict, resumption
    assert resumption.verdict.value == verdict.value
    assert str(resumption.verdict) == verdict.value
    assert not resumption.ok
    assert not resumption.verdict.ok
    assert resumption.events == []
    assert resumption.evidence.replayed is None
    assert resumption.evidence.torn_down is torn_down
    check_reason(resumption)


def check_resumed(
    resumption: Resumption,
    expected: Sequence[tuple[str, str, int, bytes | None]],
    sequence: str | None,
) -> None:
    """A success: exactly ``expected`` (id, sequence, position, payload), in order."""
    assert resumption.verdict is Verdict.RESUMED, resumption
    assert resumption.verdict.value == "resumed"
    assert resumption.ok
    assert resumption.verdict.ok
    assert resumption.sequence == sequence
    assert triples(resumption) == list(expected)
    assert resumption.evidence.replayed == len(expected)
    assert resumption.evidence.torn_down is False
    check_reason(resumption)


async def replica(
    make_buffer: MakeBuffer, first: ReplayBuffer, *, teardown_on_failure: bool = True
) -> ReplayBuffer:
    """A second replica of the server ``first`` talks to: a buffer on the same storage.

    A server backend (Redis, Valkey, cluster, fakeredis) gets a second buffer
    from ``make_buffer`` with the same retention settings: its own client and
    connection pool, the same key prefix, so it sees the same sessions.

    An in-process backend (``memory://``) keeps its data inside the backend
    object, so every ``from_url`` is a separate store and a second
    ``make_buffer()`` would see nothing. The replicas of one process share one
    backend object; such a replica is made with the public constructor
    ``ReplayBuffer(first.backend, ...)``. Which of the two applies is found out
    through the public API (does the new buffer see a session ``first`` opened?).
    """
    r = first.retention
    other = await make_buffer(
        max_events=r.max_events,
        max_age=r.max_age,
        session_ttl=r.session_ttl,
        tombstone_ttl=r.tombstone_ttl,
        max_payload=r.max_payload,
        teardown_on_failure=teardown_on_failure,
    )
    probe = f"replica-probe-{uuid.uuid4().hex}"
    await first.open_session(probe)
    try:
        shared = await other.session_info(probe) is not None
    finally:
        await first.close_session(probe)
    if shared:
        return other
    return ReplayBuffer(first.backend, teardown_on_failure=teardown_on_failure)


async def append_plan(
    buffer: ReplayBuffer, session: str, plan: Sequence[tuple[str, bytes | None]]
) -> list[tuple[str, str, int, bytes | None]]:
    """Append ``(sequence, payload)`` one by one; return the log as (id, seq, position, payload)."""
    log = []
    for sequence, payload in plan:
        event_id = await buffer.append(session, sequence, payload)
        log.append((event_id, sequence, pos(event_id), payload))
    return log


def after(
    log: Sequence[tuple[str, str, int, bytes | None]], sequence: str, position: int
) -> list[tuple[str, str, int, bytes | None]]:
    """The events of ``sequence`` in ``log`` strictly after ``position``."""
    return [entry for entry in log if entry[1] == sequence and entry[2] > position]


def kwargs_for(teardown: bool) -> dict[str, Any]:
    return {"teardown_on_failure": teardown}

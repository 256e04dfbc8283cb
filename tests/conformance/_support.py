"""Helpers shared by the conformance tests (public API only, no backend internals)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence

from replaystore import Cursor, ReplayBuffer, Resumption, Verdict

MakeBuffer = Callable[..., Awaitable[ReplayBuffer]]

#: A reason that is only a short code (``"missing_event"``) instead of a sentence.
_BARE_CODE = re.compile(r"[a-z_]+")


def pos(event_id: str) -> int:
    """The position an event id carries."""
    return Cursor.parse(event_id).position


def epoch_of(event_id: str) -> str:
    return Cursor.parse(event_id).epoch


def bare(event_id: str) -> str:
    """An event id without its hint: ``<epoch>-<position>``."""
    return str(Cursor.parse(event_id).bare)


def triples(resumption: Resumption) -> list[tuple[str, str, int, bytes | None]]:
    """The replayed events as plain tuples (ids without their hint), in replay order."""
    return [(bare(e.event_id), e.sequence, e.position, e.payload) for e in resumption.events]


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
    assert triples(resumption) == [(bare(i), s, p, d) for i, s, p, d in expected]
    for event in resumption.events:  # every replayed id carries a hint that checks out
        cursor = Cursor.parse(event.event_id)
        assert cursor.tag is not None, event
    assert resumption.evidence.replayed == len(expected)
    assert resumption.evidence.torn_down is False
    check_reason(resumption)


async def replica(
    make_buffer: MakeBuffer, first: ReplayBuffer, *, teardown_on_failure: bool = True
) -> ReplayBuffer:
    """A second replica of the server ``first`` talks to: same storage, same retention.

    ``make_buffer`` gives every buffer of one test the same key prefix (and, for
    ``memory://``, the same named in-process store), so a second buffer is a
    second replica with its own client. Callers check that it does see the
    first one's sessions before relying on it.
    """
    r = first.retention
    return await make_buffer(
        max_events=r.max_events,
        max_age=r.max_age,
        session_ttl=r.session_ttl,
        tombstone_ttl=r.tombstone_ttl,
        max_payload=r.max_payload,
        teardown_on_failure=teardown_on_failure,
    )


async def append_plan(
    buffer: ReplayBuffer, session: str, plan: Sequence[tuple[str, bytes | None]]
) -> list[tuple[str, str, int, bytes | None]]:
    """Append ``(sequence, payload)`` one by one; return the log as (id, seq, position, payload)."""
    log = []
    for sequence, payload in plan:
        event_id = await buffer.append(session, sequence, payload)
        log.append((bare(event_id), sequence, pos(event_id), payload))
    return log


def after(
    log: Sequence[tuple[str, str, int, bytes | None]], sequence: str, position: int
) -> list[tuple[str, str, int, bytes | None]]:
    """The events of ``sequence`` in ``log`` strictly after ``position``."""
    return [entry for entry in log if entry[1] == sequence and entry[2] > position]

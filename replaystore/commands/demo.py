"""``replaystore demo``: seven scripted reconnects played against a real store, verdict by verdict.

The scenario: an MCP session multiplexes two event streams, the top-level
stream (``_GET_stream``, as the SDK names it) and the stream of a long tool
call (``tool-7``); positions are counted session-wide. The client's last
top-level event was at position 3120 and its last tool event at 4471; a
count-based ring buffer has evicted everything up to 4400. The client then
reconnects in the ways seen behind reverse proxies and stale replicas: from
each stream's own cursor (the top-level one is evicted, but no top-level
event after it is, so it resumes exactly), from an older top-level cursor
(top-level events after it are gone), with the tool stream's cursor on the top-level
stream (one ``Last-Event-ID`` slot, two streams), with a bare position, with a
cursor ahead of the store, and with a cursor of an earlier incarnation.

Each attempt is answered twice: by replaystore, with a verdict and its
evidence, and by a naive store of the kind in common use (one global counter,
replay "everything after the id, from the floor"), whose answer is computed by
running it, not written down. Every attempt runs on a fresh copy of the
session, because a failed attempt tears the session down (that is the point).
The session has a name of its own and the demo deletes its keys when it ends,
so it can run against a shared Redis.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from ..backends.coordination import Coordinated
from ..buffer import ReplayBuffer
from ..verdicts import Resumption

__all__ = ["run_demo"]

TOP, SUB = "_GET_stream", "tool-7"
_CLEANUP_SECONDS = 10.0
TOP_CURSOR, SUB_CURSOR, FLOOR = 3120, 4471, 4401


@dataclass(frozen=True)
class _Stored:
    position: int
    sequence: str
    payload: bytes


def _scenario() -> list[tuple[str, bytes]]:
    """(sequence, payload) for positions 1, 2, ...: the session up to the drop, then the rest."""
    events: list[tuple[str, bytes]] = []
    for i in range(1, TOP_CURSOR + 1):  # the top-level stream, up to the client's cursor 3120
        events.append((TOP, b'{"method":"notifications/message","n":%d}' % i))
    for i in range(TOP_CURSOR + 1, SUB_CURSOR + 1):  # tool-7 runs long; one top-level progress
        if i == 4450:
            events.append((TOP, b'{"method":"notifications/progress","progress":4450}'))
        else:
            events.append((SUB, b'{"method":"notifications/progress","tool":7,"step":%d}' % i))
    # After the drop: the tool result and one more top-level notification.
    events.append((SUB, b'{"result":{"content":"tool-7 done"}}'))
    events.append((TOP, b'{"method":"notifications/resources/updated"}'))
    return events


class _NaiveStore:
    """What stores in the field do: ids are a bare global counter, replay clamps to the floor."""

    def __init__(self, events: list[tuple[str, bytes]], max_events: int) -> None:
        kept = list(enumerate(events, start=1))[-max_events:]
        self.ring = [_Stored(pos, seq, payload) for pos, (seq, payload) in kept]

    def replay_after(self, last_event_id: str) -> list[_Stored]:
        try:
            cursor = int(last_event_id.rsplit("-", 1)[-1])
        except ValueError:
            return []  # unknown id: an empty 200
        return [e for e in self.ring if e.position > cursor]  # every stream, from the floor


async def _fresh(url: str, max_events: int, session: str) -> tuple[ReplayBuffer, dict[int, str]]:
    buf = ReplayBuffer.from_url(url, max_events=max_events)
    await buf.__aenter__()
    await buf.close_session(session)
    info = await buf.open_session(session)
    ids: dict[int, str] = {}
    events = _scenario()
    position = 0
    # Bursts of one sequence go in one atomic append_many (one round trip on Redis).
    start = 0
    while start < len(events):
        seq = events[start][0]
        end = start
        while end < len(events) and events[end][0] == seq:
            end += 1
        for offset, event_id in enumerate(
            await buf.append_many(session, seq, [p for _, p in events[start:end]])
        ):
            ids[position + offset + 1] = event_id
        position += end - start
        start = end
    assert ids[1].startswith(info.epoch)
    return buf, ids


async def _delete_keys(buf: ReplayBuffer, session: str) -> None:
    """Delete every key the demo's session left in a shared store, tombstones included.

    Only a store shared beyond the process keeps anything after it; the
    coordination its backend declares knows the store's layout and deletes
    them. A backend declaring none keeps nothing the demo could find.
    """
    backend = buf.backend
    if isinstance(backend, Coordinated):
        await backend.coordination().purge(session)


def _describe(res: Resumption) -> list[str]:
    ev = res.evidence.as_dict()
    keep = (
        "cursor_position",
        "floor",
        "high_water",
        "sequence",
        "cursor_sequence",
        "sequence_floor",
        "sequence_high_water",
        "torn_down",
    )
    lines = [f"  verdict : {res.verdict.value}  ({res.evidence.reason})"]
    lines.append("  evidence: " + ", ".join(f"{k}={ev[k]}" for k in keep if k in ev))
    if res.ok:
        shown = ", ".join(f"{e.position}:{e.sequence}" for e in res.events) or "nothing missed"
        lines.append(f"  replayed: {len(res.events)} event(s): {shown}")
    return lines


def _naive(store: _NaiveStore, last_event_id: str, wanted: str) -> str:
    got = store.replay_after(last_event_id)
    if not got:
        return "200 OK, empty stream: the client waits forever or silently moves on"
    streams = sorted({e.sequence for e in got})
    foreign = sum(1 for e in got if e.sequence != wanted)
    first = got[0].position
    parts = [f"200 OK, replays {len(got)} events from position {first} ({', '.join(streams)})"]
    try:
        cursor = int(last_event_id.rsplit("-", 1)[-1])
    except ValueError:
        cursor = first - 1
    if first > cursor + 1:
        parts.append(f"silently skips {cursor + 1}..{first - 1}")
    if foreign:
        parts.append(f"{foreign} belong to another stream")
    return "; ".join(parts)


async def run_demo(url: str = "memory://", out: Callable[[str], None] = print) -> int:
    """Play the scenario; return the number of attempts whose verdict was not the expected one."""
    max_events = len(_scenario()) - FLOOR + 1  # the ring size that leaves the floor at 4401
    session = f"demo-{secrets.token_hex(6)}"
    # The store first: an unreachable one is an error alone, with no header above it.
    buf, ids = await _fresh(url, max_events, session)
    out(f"replaystore demo on {url}: session {session!r}, ring buffer of {max_events} events")
    out(f"streams {TOP!r} (client cursor {TOP_CURSOR}) and {SUB!r} (client cursor {SUB_CURSOR});")
    out(f"retention has evicted everything up to {FLOOR - 1}.\n")
    naive = _NaiveStore(_scenario(), max_events)
    # (title, Last-Event-ID template, sequence named, stream the client wants, expected verdict)
    attempts: list[tuple[str, str, str | None, str, str]] = [
        ("resume the tool sub-stream from its own cursor", "{e}-4471", None, SUB, "resumed"),
        (
            "resume the top-level stream from its cursor: its event is evicted, none after it",
            "{e}-3120",
            TOP,
            TOP,
            "resumed",
        ),
        (
            "a top-level client that dropped earlier, at 3000: 3001..3120 are evicted",
            "{e}-3000",
            TOP,
            TOP,
            "below_floor",
        ),
        (
            "one Last-Event-ID slot: the GET stream reconnects with the sub-stream cursor",
            "{e}-4471",
            TOP,
            TOP,
            "sequence_mismatch",
        ),
        ("a bare position, as naive stores issue them", "4471", None, SUB, "malformed_cursor"),
        ("a replica that has not caught up is ahead", "{e}-4971", None, SUB, "ahead_of_high_water"),
        ("a cursor of an earlier incarnation", "000000000000-4471", None, SUB, "foreign_cursor"),
    ]
    wrong = 0
    try:
        for number, (title, template, sequence, wanted, expected) in enumerate(attempts, 1):
            if number > 1:
                await buf.aclose()
                buf, ids = await _fresh(url, max_events, session)
            cursor = template.format(e=ids[1].split("-")[0])
            named = f", sequence={sequence!r}" if sequence else ""
            out(f"#{number} {title}\n  Last-Event-ID: {cursor}{named}")
            res = await buf.resolve_and_replay(session, cursor, sequence)
            for line in _describe(res):
                out(line)
            out(f"  naive   : {_naive(naive, cursor, wanted)}")
            if res.verdict.value != expected:
                wrong += 1
                out(f"  UNEXPECTED: wanted {expected}")
            if not res.ok:
                after = await buf.resolve(session, cursor, sequence)
                out(f"  after   : every replica now sees {after.verdict.value} (fail closed)")
            out("")
    finally:
        # Shielded and bounded: the keys go even when the demo is interrupted.
        with anyio.move_on_after(_CLEANUP_SECONDS, shield=True):
            try:
                await _delete_keys(buf, session)
            except Exception as exc:  # the store went away: say so, keep the first error
                print(f"replaystore demo: could not delete its keys: {exc}", file=sys.stderr)
            finally:
                await buf.aclose()
    out("every failure above is a distinct verdict with its evidence; none is a silent 200.")
    return wrong

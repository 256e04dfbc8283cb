"""The storm's workload: sessions, their streams, and who reconnects with which cursor.

Everything is drawn from one seed, so every store in a run sees the same
sessions, the same events in the same order and the same reconnects.

Streams are named as the MCP SDK names them: ``_GET_stream`` (the standalone
stream) and the JSON-RPC request ids ``"1"``, ``"2"``.

The reconnects (``Reconnect.kind``):

``normal``
    the client resumes the stream it was reading, from an event it saw.
``conflated``
    the client resumes the GET stream with the cursor of a tool call's stream
    (one ``Last-Event-ID`` slot for two streams).
``evicted``
    the cursor fell out of retention (the session lives in a store with a small
    retention and was written past it).
``ahead``
    the cursor is ahead of anything the store issued, as when the client was
    served by a newer replica than the one it reconnects to.
``foreign``
    the cursor belongs to another session (a confused proxy, cache or client).
``second``
    a second connection resumes the same stream with the same cursor at the
    same time as the first (both are judged on their own).

For the four pathologies of a cursor (conflated, evicted, ahead, foreign) no
store can bring the client back in step exactly: the correct answer is an
explicit failure. ``normal`` and ``second`` reconnects can and must resume.

Every event is a 200-byte JSON-RPC notification (:func:`message`, :func:`payload`):
the MCP stores take a message object and serialise it themselves; replaystore
and the raw floor take the bytes the SDK would put on the wire. Both forms come
from here so that every store, and every benchmark of ``benchmarks/``, stores
the same bytes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache

from mcp_types import JSONRPCNotification

__all__ = [
    "EVICTED_PREFIX",
    "KINDS",
    "PATHOLOGIES",
    "PAYLOAD_BYTES",
    "STREAMS",
    "Reconnect",
    "SessionPlan",
    "message",
    "payload",
    "plan_reconnects",
    "plan_sessions",
]

PAYLOAD_BYTES = 200
"""Serialized size of every event."""

_FRAME = len(
    JSONRPCNotification(
        jsonrpc="2.0", method="notifications/message", params={"level": "info", "data": ""}
    ).model_dump_json(by_alias=True)
)


@cache
def message(i: int) -> JSONRPCNotification:
    """A notification whose serialized form is exactly :data:`PAYLOAD_BYTES` long."""
    data = f"{i % 10**8:08d}".ljust(PAYLOAD_BYTES - _FRAME, "x")
    return JSONRPCNotification(
        jsonrpc="2.0", method="notifications/message", params={"level": "info", "data": data}
    )


@cache
def payload(i: int) -> bytes:
    """The wire bytes of :func:`message` (what replaystore and the raw floor store)."""
    return message(i).model_dump_json(by_alias=True).encode()


EVICTED_PREFIX = "ev-"
"""Sessions whose names start with this live in each store's small-retention instance."""

STREAMS = ("_GET_stream", "1", "2")
PATHOLOGIES = ("conflated", "evicted", "ahead", "foreign", "second")
KINDS = ("normal", *PATHOLOGIES)
IMPOSSIBLE = frozenset({"conflated", "evicted", "ahead", "foreign"})
WINDOW = 3  # a normal client last saw one of the newest WINDOW events of its stream

StreamKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class SessionPlan:
    session: str
    streams: tuple[str, ...]
    events_per_stream: int
    owner: int  # the replica that opened it and writes to it


@dataclass(frozen=True, slots=True)
class Reconnect:
    """One reconnect: the stream the client wants, the cursor it presents, what it holds."""

    id: int
    kind: str
    session: str
    stream: str
    cursor: str  # for "ahead", the store's forged id is made from this in the replica
    held: int  # index in the stream's truth of the last event the client holds
    replica: int  # the replica that serves it

    @property
    def possible(self) -> bool:
        """Whether an exact resumption can exist (evicted: yes on a store that keeps all)."""
        return self.kind not in IMPOSSIBLE


def plan_sessions(
    n: int, *, replicas: int, events: int, pathology_rate: float, small_retention: int, seed: int
) -> list[SessionPlan]:
    """``n`` sessions of 2 or 3 streams; the sessions of the evicted case come on top.

    History sizes vary (``events`` // 2 to ``events`` * 2 per stream), so the
    cost against history size can be read off the same run.
    """
    rng = random.Random(seed)
    out = []
    for i in range(n):
        per = rng.randint(max(1, events // 2), max(2, events * 2))
        out.append(SessionPlan(f"s{i:06d}", STREAMS[: 2 + i % 2], per, i % replicas))
    for i in range(_per_kind(n, pathology_rate)):
        # One stream, written past the small retention: its early events are gone.
        out.append(
            SessionPlan(f"{EVICTED_PREFIX}{i:06d}", STREAMS[:1], small_retention + 5, i % replicas)
        )
    return out


def _per_kind(n: int, rate: float) -> int:
    return max(1, round(n * rate / len(PATHOLOGIES))) if rate > 0 else 0


def plan_reconnects(
    sessions: list[SessionPlan],
    truth: dict[StreamKey, list[str]],
    *,
    replicas: int,
    share: float,
    pathology_rate: float,
    sticky: bool,
    seed: int,
) -> list[Reconnect]:
    """Who reconnects: ``share`` of the sessions, ``pathology_rate`` of them pathologically.

    Each pathology takes ``pathology_rate / 5`` of the sessions (the evicted
    case comes with its own sessions, on top).

    A session takes part in one reconnect (two for ``second``), so that a
    failed one (which ends the session) never spoils another. Reconnects go to
    a replica other than the session's writer unless ``sticky``.
    """
    rng = random.Random(seed + 1)
    chosen, lenders = _choose(sessions, rng, share, pathology_rate)
    out: list[Reconnect] = []

    def add(kind: str, plan: SessionPlan, stream: str, cursor: str, held: int) -> None:
        replica = plan.owner if sticky or replicas == 1 else (plan.owner + 1) % replicas
        out.append(Reconnect(len(out), kind, plan.session, stream, cursor, held, replica))

    def recent(key: StreamKey) -> int:
        ids = truth[key]
        return rng.randrange(max(0, len(ids) - WINDOW), len(ids))

    for plan in chosen["normal"]:
        stream = rng.choice(plan.streams)
        held = recent((plan.session, stream))
        add("normal", plan, stream, truth[(plan.session, stream)][held], held)
    for plan in chosen["second"]:
        stream = rng.choice(plan.streams)
        held = recent((plan.session, stream))
        for _ in range(2):
            add("second", plan, stream, truth[(plan.session, stream)][held], held)
    for plan in chosen["conflated"]:
        get = (plan.session, STREAMS[0])
        tool = truth[(plan.session, STREAMS[1])]
        add("conflated", plan, STREAMS[0], tool[rng.randrange(len(tool))], len(truth[get]) - 1)
    for plan in chosen["ahead"]:
        stream = rng.choice(plan.streams)
        ids = truth[(plan.session, stream)]
        add("ahead", plan, stream, ids[-1], len(ids) - 1)
    for plan, lender in zip(chosen["foreign"], lenders, strict=False):
        ids = truth[(plan.session, STREAMS[0])]
        other = truth[(lender.session, STREAMS[0])]
        add("foreign", plan, STREAMS[0], other[rng.randrange(len(other))], len(ids) - 1)
    for plan in chosen["evicted"]:
        add("evicted", plan, STREAMS[0], truth[(plan.session, STREAMS[0])][2], 2)
    rng.shuffle(out)  # the storm hits in no particular order
    return out


def _choose(
    sessions: list[SessionPlan], rng: random.Random, share: float, pathology_rate: float
) -> tuple[dict[str, list[SessionPlan]], list[SessionPlan]]:
    """Which sessions reconnect, by kind, and whose cursors the foreign reconnects present."""
    normal = [s for s in sessions if not s.session.startswith(EVICTED_PREFIX)]
    evicted = [s for s in sessions if s.session.startswith(EVICTED_PREFIX)]
    n = len(normal)
    per_kind = _per_kind(n, pathology_rate)
    order = list(range(n))
    rng.shuffle(order)
    picks = [normal[i] for i in order]
    # Sessions of the pathologies first, then the normal reconnects; the rest stay quiet.
    cut = 0
    chosen: dict[str, list[SessionPlan]] = {}
    for kind in ("conflated", "ahead", "foreign", "second"):
        chosen[kind] = picks[cut : cut + per_kind]
        cut += per_kind
    lenders = picks[cut : cut + per_kind]  # whose cursors the foreign reconnects present
    cut += per_kind
    n_normal = max(0, round(n * share) - 4 * per_kind)
    chosen["normal"] = picks[cut : cut + n_normal]
    chosen["evicted"] = evicted
    return chosen, lenders

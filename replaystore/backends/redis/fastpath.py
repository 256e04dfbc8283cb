"""The resume fast path: a resume with a hinted cursor, judged from one pipelined read.

Most resumes name the sequence their cursor came from (the hint in the event
id), so the events they need are one list's tail. Reading the meta hash and a
native ``LRANGE`` of that list in one round trip (no Lua, no ``MULTI``; see
:meth:`FastPath.snapshot` for why none is needed) and judging them here costs
Redis a fraction of a script. Only a ``resumed`` verdict is answered this way;
anything in doubt goes to the script path (``facts.lua``), which also tears
down a session that cannot be resumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from ..._frozen import builder
from ...cursor import Cursor, sequence_tag
from ...retention import Retention
from ...rules import Judgement, Record, evidence_for, judge
from ...verdicts import Resumption, Verdict
from .keys import meta, sequence
from .replies import Facts, StoredState, decode_record, decode_state
from .scripts import CLOCK_MARGIN_MS
from .wire import Wire, pack_args

__all__ = ["DECIDED_HERE", "Failed", "FastPath"]

#: The failed verdicts the fast read decides exactly as the script would: they
#: come from the meta hash (a foreign epoch, an unknown named sequence, a
#: cursor past the high-water) or from the cursor's own event, found at its
#: place and belonging to another sequence than the one named. No eviction
#: turns one of them into another verdict. A cursor below the floor
#: (``evicted``) is decided here too when its own event is still in its list,
#: at its ordinal: the read then holds the sequence's newest evicted event,
#: the one fact the rules need (see :func:`_newest_evicted`); the floor only
#: rises, so that verdict stays. Otherwise the script decides it.
DECIDED_HERE = frozenset({"foreign", "unknown_sequence", "ahead", "mismatch"})


@dataclass(frozen=True, slots=True)
class Failed:
    """A failed verdict decided on the fast read, and the facts it was decided on."""

    judgement: Judgement
    facts: Facts


#: The two commands of a resume's read (the ``LRANGE`` without its range), for
#: a wire that sends them through redis-py.
_Commands = tuple[tuple[Any, ...], tuple[Any, ...]]

#: A resume's pipelined read, as cached per (session, sequence, named sequence):
#: ``(commands, head, base)``: the two commands, the packet up to the ``LRANGE``
#: start (for a wire that sends it by hand), and the list offset seen last (it
#: changes only when a list is compacted). A plain tuple: looked up on every
#: resume, replaced only when the offset changes.
_Read = tuple[_Commands, bytes, int]

#: The meta hash fields every read asks for, in the order of :class:`_Meta`'s fields.
_FIELDS = ("epoch", "top", "floor", "count", "nseq", "rf", "ra")
_FIXED_FIELDS = pack_args(_FIELDS)


class _Meta(NamedTuple):
    """What a resume's ``HMGET`` of the meta hash returned, field by field, as Redis sent it.

    The fields of ``_FIELDS`` in their order, then the state of the cursor's
    sequence and, when the resume names another sequence, that one's.
    """

    epoch: bytes | None
    top: bytes
    floor: bytes
    retained: bytes  # count: events retained
    nseq: bytes
    refresh_at: bytes | None  # rf: when the lazy TTL refresh falls due (ms)
    oldest_run: bytes | None  # ra: when the oldest run started (ms)
    state: bytes | None  # s:<tag> of the cursor's sequence
    named_state: bytes | None = None  # s:<tag> of the sequence named, if another


class FastPath:
    """The pipelined reads of one backend, built once per (session, sequence, named sequence)."""

    def __init__(self, wire: Wire, retention: Retention, key_base: Callable[[str], str]) -> None:
        self._wire = wire
        self.retention = retention
        # Read on every resume: the limits as numbers, not through properties.
        self._limits = (retention.max_events, retention.max_age_ms)
        self.key_base = key_base
        self._reads: dict[tuple[str, str, str | None], _Read] = {}

    def read(self, session: str, tag: str, named: str | None) -> _Read:
        """The fast path's read of one sequence (and the named one), built once per triple.

        In a reconnect storm nearly every resume is its session's first, so
        the build is on the hot path: the fixed fields are packed once.
        """
        cache_key = (session, tag, named)
        read = self._reads.get(cache_key)
        if read is None:
            base = self.key_base(session)
            hash_key, list_key = meta(base), sequence(base, tag)
            named_tag = sequence_tag(named) if named is not None else tag
            extra = (f"s:{tag}",) if named_tag == tag else (f"s:{tag}", f"s:{named_tag}")
            head = b"".join(
                (
                    b"*%d\r\n$5\r\nHMGET\r\n" % (9 + len(extra)),
                    pack_args((hash_key,)),
                    _FIXED_FIELDS,
                    pack_args(extra),
                    b"*4\r\n$6\r\nLRANGE\r\n",
                    pack_args((list_key,)),
                )
            )
            hmget = ("HMGET", hash_key, *_FIELDS, *extra)
            commands = (hmget, ("LRANGE", list_key))  # the range changes per resume
            if len(self._reads) > 10_000:
                self._reads.clear()
            read = self._reads[cache_key] = (commands, head, 0)
        return read

    def _learn(self, session: str, tag: str, named: str | None, read: _Read, base: int) -> None:
        """Remember the list offset a read found, for the next reads of that sequence."""
        self._reads[(session, tag, named)] = (read[0], read[1], base)

    async def snapshot(
        self, session: str, cursor: Cursor, raw_cursor: str, named: str | None
    ) -> Resumption | Failed | None:
        """The fast path: one pipelined read, no Lua; ``None`` when in doubt.

        A ``resumed`` verdict is answered here, and the failed verdicts of
        :data:`DECIDED_HERE` are returned as :class:`Failed` for the caller
        to tear down; anything else (and any read that shows work due:
        eviction, a TTL refresh) goes to the script path.

        The ``HMGET`` and the ``LRANGE`` need no ``MULTI`` around them: between
        the two, a sequence's list only grows at its tail (events the
        bookkeeping read first does not count, so they are cut off), and any
        change at its head (a trim of evicted elements, a sweep, a lost list
        whose places are held, the sequence created again) moves what sits at
        the cursor's ordinal, which must be the cursor's own event (position
        and stamp) or the read is in doubt. So the events after it are the
        sequence's events as of the ``HMGET``, as in a snapshot.
        """
        tag, ordinal = cursor.tag, cursor.ordinal
        assert tag is not None
        assert ordinal is not None
        got = await self._fetch(session, tag, named, ordinal)
        if got is None:
            return None
        meta, state, elements = got
        if self._due(meta, state):
            return None
        facts = _facts(meta, state, elements, cursor, named)
        if facts is None:
            return None
        judgement = judge(facts, cursor, named)
        if judgement.verdict is not Verdict.RESUMED:
            decided = judgement.code in DECIDED_HERE or facts.evicted is not None
            return Failed(judgement, facts) if decided else None
        if facts.record_at is None:
            return None  # only a chain that starts at the cursor's own event was read
        evidence = evidence_for(
            session, raw_cursor, cursor, facts, judgement, torn_down=False, replay=True
        )
        return _new_resumption(
            judgement.verdict, evidence, judgement.sequence, judgement.chain.events(facts.epoch)
        )

    async def _fetch(
        self, session: str, tag: str, named: str | None, ordinal: int
    ) -> tuple[_Meta, StoredState, list[Any]] | None:
        """The meta hash and the list from the cursor's ordinal on, in one round trip (the
        ``LRANGE`` by hand where the wire can); ``None`` when in doubt.

        The list is read from the offset this process saw last; a read that
        finds another offset (the list was compacted) is sent once more from
        the new one.
        """
        read = self.read(session, tag, named)
        base = read[2]  # other resumes may learn another one meanwhile: this read's own
        for _ in range(2):
            if ordinal < base:
                # Evicted and compacted away, or the offset is stale (the
                # sequence was created again): the script decides, and the
                # next read learns the offset anew.
                self._learn(session, tag, named, read, 0)
                return None
            start = ordinal - base
            digits = b"%d" % start
            packet = read[1] + b"$%d\r\n%s\r\n$2\r\n-1\r\n" % (len(digits), digits)
            commands = read[0]
            values, elements = await self._wire.read(
                commands[0][1], packet, 2, partial(_ranged, commands, start)
            )
            if isinstance(values, Exception):
                raise values
            if isinstance(elements, Exception):
                raise elements
            meta = _Meta(*values)
            if meta.epoch is None or meta.state is None:
                return None
            state = decode_state(meta.state)
            if state.base == base:
                return meta, state, elements
            base = state.base
            self._learn(session, tag, named, read, base)
        return None

    def _due(self, meta: _Meta, state: StoredState) -> bool:
        """Whether the read shows work the scripts do first: an eviction, a TTL refresh.

        Work that falls due by the clock (a TTL refresh, an age eviction) is
        read from the meta hash and compared with this process's clock, with a
        margin for the two clocks' difference; near either moment, or when the
        newest event was stamped ahead of this clock, the script decides.
        """
        max_events, max_age_ms = self._limits
        retained = int(meta.retained)
        if retained > max_events:
            return True
        now_ms = time.time() * 1000 + CLOCK_MARGIN_MS
        if meta.refresh_at is None or now_ms >= int(meta.refresh_at) or state.stamp > now_ms:
            return True
        return bool(
            max_age_ms
            and retained
            and (meta.oldest_run is None or int(meta.oldest_run) + max_age_ms <= now_ms)
        )


def _ranged(commands: _Commands, start: int) -> list[tuple[Any, ...]]:
    """A resume's read as commands (for redis-py): the ``LRANGE`` from ``start`` on."""
    hmget, lrange = commands
    return [hmget, (*lrange, start, -1)]


def _facts(
    meta: _Meta, state: StoredState, elements: list[Any], cursor: Cursor, named: str | None
) -> Facts | None:
    """The facts the rules judge, from the read; ``None`` when the read cannot tell."""
    tag, ordinal, epoch = cursor.tag, cursor.ordinal, meta.epoch
    assert tag is not None
    assert ordinal is not None
    assert epoch is not None  # a read without one is in doubt (``_fetch``)
    public = state.public
    states = {tag: public}
    if meta.named_state is not None:
        other = decode_state(meta.named_state).public
        states[other.tag] = other
    record = decode_record(elements[0], public.name, ordinal) if elements else None
    if record is not None and (record.position != cursor.position or record.stamp != cursor.stamp):
        record = None  # not the cursor's event: the script looks it up
    floor = int(meta.floor)
    evicted = None
    if record is not None and cursor.position < floor and _named_is_hinted(named, tag):
        # The cursor's own event, evicted but still in its list, found at
        # its ordinal: the sequence's newest evicted event (ordinal
        # ``first - 1``, at or after the cursor's) came with it in the
        # same read, as ``facts.lua`` would find it.
        evicted = _newest_evicted(state, elements, ordinal)
        if evicted is None:
            return None
    return Facts(
        epoch.decode(),
        int(meta.top),
        floor,
        int(meta.retained),
        int(meta.nseq),  # sequence_count
        states,
        tag,  # chain_tag
        ordinal + 1,  # chain_ordinal
        elements[1:] if record is not None else [],
        record,  # record_at
        evicted,  # the newest evicted event, when the cursor's is evicted
    )


def _named_is_hinted(named: str | None, tag: str) -> bool:
    """Whether the sequence a resume names (if any) is the one its cursor's hint names."""
    return named is None or sequence_tag(named) == tag


def _newest_evicted(state: StoredState, elements: list[Any], ordinal: int) -> Record | None:
    """The newest evicted event of the sequence read from ``ordinal`` on, or ``None`` if unread.

    Mirrors ``facts.lua``: an emptied sequence's state names it; otherwise it
    is the list element at ordinal ``first - 1``.
    """
    public = state.public
    if public.first_ordinal >= public.next_ordinal:
        return state.newest_evicted(None)
    at = public.first_ordinal - 1 - ordinal
    if public.first_ordinal <= state.base or not 0 <= at < len(elements):
        return None
    return state.newest_evicted(elements[at])


_new_resumption = builder(Resumption)  # one per resume (see ``_frozen``)

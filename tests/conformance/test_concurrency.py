"""Many tasks at once on one session: positions stay unique and gap-free, and
every replay is an exact, contiguous piece of its own sequence.

A replay observed while writers are still appending cannot be compared with a
fixed list, but it can be with the final log: the events of a sequence after a
cursor, as of any moment, are a *prefix* of that sequence's events after the
cursor in the final log (positions are handed out atomically, in order).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from replaystore import Resumption, UnknownSessionError, Verdict

from ._support import epoch_of, pos, replica

pytestmark = pytest.mark.anyio

S = "busy"
SEQS = ("s0", "s1", "s2", "s3")
WRITERS = 20
PER_WRITER = 50
RESUMERS = 10
MIN_ROUNDS = 5  # each resumer keeps going at least this long, even after the writers


def _payload(writer: int, index: int) -> bytes:
    return b"w%d-%d" % (writer, index)


async def _write(buf, writer: int, sequence: str, out: dict, seen: list) -> None:
    """Append PER_WRITER events, singly and in small batches; record the returned ids."""
    ids: list[str] = []
    index = 0
    while index < PER_WRITER:
        size = 1 if (writer + index) % 4 else min(3, PER_WRITER - index)
        payloads = [_payload(writer, index + k) for k in range(size)]
        if size == 1:
            new = [await buf.append(S, sequence, payloads[0])]
        else:
            new = await buf.append_many(S, sequence, payloads)
        assert [pos(i) for i in new] == list(range(pos(new[0]), pos(new[0]) + size))
        ids += new
        seen.extend((event_id, sequence) for event_id in new)
        index += size
        await anyio.lowlevel.checkpoint()  # the memory backend never yields inside a call
    out[writer] = ids


def _check_final_log(written: dict[int, list[str]], writers: int, epoch: str):
    """Unique, gap-free positions; each writer's ids increasing. Returns lookup tables."""
    all_ids = [event_id for ids in written.values() for event_id in ids]
    positions = sorted(pos(i) for i in all_ids)
    assert positions == list(range(1, writers * PER_WRITER + 1))  # unique and gap-free
    assert {epoch_of(i) for i in all_ids} == {epoch}
    for ids in written.values():
        assert len(ids) == PER_WRITER
        mine = [pos(i) for i in ids]
        assert mine == sorted(mine)
        assert len(set(mine)) == len(mine)  # strictly increasing
    payload_of = {
        event_id: _payload(writer, index)
        for writer, ids in written.items()
        for index, event_id in enumerate(ids)
    }
    return payload_of


def _check_replay(res: Resumption, cursor: str, sequence: str, order, payload_of) -> int:
    """The replay is exactly the next events of ``sequence`` after ``cursor`` as of some moment."""
    assert res.verdict is Verdict.RESUMED, res
    assert res.sequence == sequence
    got = [e.event_id for e in res.events]
    assert len(set(got)) == len(got)  # no duplicates
    for event in res.events:
        assert event.sequence == sequence  # nothing of another sequence
        assert event.event_id in payload_of  # only ids some writer was given
        assert event.payload == payload_of[event.event_id]
        assert event.position == pos(event.event_id)
    follow = order[sequence][order[sequence].index(cursor) + 1 :]
    assert got == follow[: len(got)]  # contiguous, increasing, from right after the cursor
    last = pos(got[-1]) if got else pos(cursor)
    assert res.evidence.sequence_high_water == last
    return len(got)


Pick = Callable[[random.Random, list[tuple[str, str]]], tuple[str, str]]
Observation = tuple[str, str, Resumption]


async def _race(
    writer_buf, reader_buf, writers: int, sequences: tuple[str, ...], pick: Pick
) -> tuple[dict[int, list[str]], list[Observation]]:
    """Writers append while RESUMERS tasks resume cursors chosen by ``pick``
    (each at least MIN_ROUNDS times); the ids written and every resume seen."""
    written: dict[int, list[str]] = {}
    seen: list[tuple[str, str]] = []
    observations: list[Observation] = []
    done = anyio.Event()

    async def resumer(r: int) -> None:
        rng = random.Random(r)
        rounds = 0
        while not done.is_set() or rounds < MIN_ROUNDS:
            if seen:
                cursor, sequence = pick(rng, seen)
                named = sequence if rng.random() < 0.5 else None
                res = await reader_buf.resolve_and_replay(S, cursor, named)
                observations.append((cursor, sequence, res))
                rounds += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as everyone:
        for r in range(RESUMERS):
            everyone.start_soon(resumer, r)
        async with anyio.create_task_group() as tg:
            for w in range(writers):
                tg.start_soon(_write, writer_buf, w, sequences[w % len(sequences)], written, seen)
        done.set()
    return written, observations


async def test_writers_and_resumers_at_once(make_buffer):
    writer_buf = await make_buffer(max_events=WRITERS * PER_WRITER + 100)
    reader_buf = await replica(make_buffer, writer_buf, teardown_on_failure=False)
    info = await writer_buf.open_session(S)
    assert (await reader_buf.session_info(S)).epoch == info.epoch

    written, observations = await _race(
        writer_buf, reader_buf, WRITERS, SEQS, lambda rng, seen: seen[rng.randrange(len(seen))]
    )

    payload_of = _check_final_log(written, WRITERS, info.epoch)
    order = {
        sequence: [
            event_id
            for w in range(WRITERS)
            if SEQS[w % len(SEQS)] == sequence
            for event_id in written[w]
        ]
        for sequence in SEQS
    }
    for sequence in SEQS:
        order[sequence].sort(key=pos)
        # within a sequence, each writer's events keep the order it wrote them in
        mine = [payload_of[i] for i in order[sequence]]
        for w in range(WRITERS):
            if SEQS[w % len(SEQS)] == sequence:
                own = [p for p in mine if p.startswith(b"w%d-" % w)]
                assert own == [_payload(w, i) for i in range(PER_WRITER)]

    replayed = [_check_replay(res, c, s, order, payload_of) for c, s, res in observations]
    assert len(observations) >= RESUMERS * MIN_ROUNDS
    assert sum(replayed) > 0

    snap = await reader_buf.session_info(S)
    assert (snap.floor, snap.high_water, snap.retained) == (
        1,
        WRITERS * PER_WRITER,
        WRITERS * PER_WRITER,
    )
    for sequence in SEQS:
        assert snap.sequences[sequence].retained == (WRITERS // len(SEQS)) * PER_WRITER
        res = await writer_buf.resolve_and_replay(S, str(info.origin), sequence)
        assert [e.event_id for e in res.events] == order[sequence]


async def test_resumes_while_eviction_and_compaction_run(make_buffer):
    """Resumes racing appends that evict on every call (so lists are trimmed
    and swept under the readers): a resume is exactly the next events of the
    cursor's sequence as of some moment, or ``below_floor`` once the cursor's
    event is evicted; never another event, never a hole."""
    cap = 60
    writer_buf = await make_buffer(max_events=cap)
    reader_buf = await replica(make_buffer, writer_buf, teardown_on_failure=False)
    info = await writer_buf.open_session(S)
    assert (await reader_buf.session_info(S)).epoch == info.epoch
    writers = 8

    def pick(rng: random.Random, seen: list[tuple[str, str]]) -> tuple[str, str]:
        # mostly recent cursors (resumed), sometimes old ones (evicted)
        back = rng.randrange(min(len(seen), 40 if rng.random() < 0.8 else len(seen)))
        return seen[len(seen) - 1 - back]

    written, observations = await _race(writer_buf, reader_buf, writers, SEQS[:2], pick)
    payload_of = _check_final_log(written, writers, info.epoch)
    order = {
        sequence: sorted(
            (i for w, ids in written.items() if SEQS[w % 2] == sequence for i in ids), key=pos
        )
        for sequence in SEQS[:2]
    }
    verdicts = {Verdict.RESUMED: 0, Verdict.BELOW_FLOOR: 0}
    for cursor, sequence, res in observations:
        assert res.verdict in verdicts, (cursor, res)
        verdicts[res.verdict] += 1
        if res.verdict is Verdict.RESUMED:
            _check_replay(res, cursor, sequence, order, payload_of)
    assert verdicts[Verdict.RESUMED] > 0, verdicts
    snap = await reader_buf.session_info(S)
    assert (snap.high_water, snap.retained) == (writers * PER_WRITER, cap)


async def test_two_replicas_appending_to_one_session(make_buffer):
    one = await make_buffer(max_events=5000)
    two = await replica(make_buffer, one)
    info = await one.open_session(S)
    assert (await two.open_session(S)).epoch == info.epoch  # idempotent on the other replica
    written: dict[int, list[str]] = {}
    seen: list[tuple[str, str]] = []
    writers = 10
    async with anyio.create_task_group() as tg:
        for w in range(writers):
            tg.start_soon(_write, (one, two)[w % 2], w, SEQS[w % 2], written, seen)
    payload_of = _check_final_log(written, writers, info.epoch)
    for sequence in SEQS[:2]:
        expected = sorted(
            (i for w, ids in written.items() if SEQS[w % 2] == sequence for i in ids), key=pos
        )
        for buf in (one, two):
            res = await buf.resolve_and_replay(S, str(info.origin), sequence)
            assert res.ok
            assert [e.event_id for e in res.events] == expected
            assert [e.payload for e in res.events] == [payload_of[i] for i in expected]
    assert (await two.session_info(S)).high_water == writers * PER_WRITER


async def test_teardown_under_concurrent_appends_is_final(make_buffer):
    """Once one replica tears the session down, no in-flight append brings it back."""
    one = await make_buffer()
    two = await replica(make_buffer, one)
    info = await one.open_session(S)
    accepted: list[str] = []
    refused = [0]
    torn = anyio.Event()
    teardown: list[Resumption] = []

    async def writer(w: int) -> None:
        buf = (one, two)[w % 2]
        for i in range(200):
            try:
                accepted.append(await buf.append(S, SEQS[w % 4], _payload(w, i)))
            except UnknownSessionError:
                refused[0] += 1
                if torn.is_set():
                    return
            if len(accepted) > 40 and not torn.is_set() and w == 0:
                teardown.append(await two.resolve_and_replay(S, f"{info.epoch}-999999"))
                torn.set()
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for w in range(8):
            tg.start_soon(writer, w)

    assert teardown, "the teardown never ran"
    assert teardown[0].verdict is Verdict.AHEAD_OF_HIGH_WATER
    assert teardown[0].evidence.torn_down
    assert refused[0] > 0
    for buf in (one, two):
        assert await buf.session_info(S) is None
        with pytest.raises(UnknownSessionError):
            await buf.append(S, "s0", b"late")
        gone = await buf.resolve(S, accepted[0])
        assert gone.verdict is Verdict.UNKNOWN_SESSION
        assert gone.evidence.tombstone.verdict is Verdict.AHEAD_OF_HIGH_WATER
    # every accepted event was issued before the teardown: positions are 1..n, no gap
    assert sorted(pos(i) for i in accepted) == list(range(1, len(accepted) + 1))

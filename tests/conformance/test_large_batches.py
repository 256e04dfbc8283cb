"""Evictions of more than one internal batch in one operation keep the bookkeeping exact.

The Redis trim loop evicts in batches of 1000; a regression once re-read the
same batch and corrupted floor and sequence counts. These cases push several
thousand evictions through single operations on every backend.
"""

from __future__ import annotations

import pytest

from replaystore import Cursor, SequenceInfo, Verdict

pytestmark = pytest.mark.anyio


async def test_one_batch_evicting_thousands(make_buffer) -> None:  # type: ignore[no-untyped-def]
    buf = await make_buffer(max_events=7)
    await buf.open_session("S")
    first = await buf.append_many("S", "a", [b"a%d" % i for i in range(2500)])
    second = await buf.append_many("S", "b", [b"b%d" % i for i in range(2504)])
    info = await buf.session_info("S")
    assert info is not None
    assert (info.floor, info.high_water, info.retained) == (4998, 5004, 7)
    assert list(info.sequences) == ["a", "b"]
    assert info.sequences["a"] == SequenceInfo(2501, 2500, 0)  # emptied, still known
    assert info.sequences["b"].floor == 4998 and info.sequences["b"].retained == 7
    res = await buf.resolve("S", first[-2])  # "a2499" after it is gone
    assert res.verdict is Verdict.BELOW_FLOOR
    res = await buf.resolve("S", first[-1])  # nothing of "a" after it, nothing missed
    assert res.verdict is Verdict.RESUMED and res.sequence == "a"
    res = await buf.resolve_and_replay("S", second[-4])
    assert res.verdict is Verdict.RESUMED
    assert [e.payload for e in res.events] == [b"b2501", b"b2502", b"b2503"]


async def test_interleaved_bursts_keep_sequence_counts(make_buffer) -> None:  # type: ignore[no-untyped-def]
    buf = await make_buffer(max_events=50)
    await buf.open_session("S")
    ids: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    for round_ in range(12):
        for seq, size in (("a", 400), ("b", 7), ("c", 1300 if round_ % 3 == 0 else 3)):
            ids[seq] += await buf.append_many("S", seq, [seq.encode()] * size)
    info = await buf.session_info("S")
    assert info is not None and info.retained == 50
    assert sum(s.retained for s in info.sequences.values()) == 50
    assert info.floor == info.high_water - 49
    for seq, state in info.sequences.items():
        if not state.retained:
            continue
        assert state.high_water == Cursor.parse(ids[seq][-1]).position
        res = await buf.resolve("S", f"{Cursor.parse(ids[seq][0]).epoch}-{state.floor}")
        assert res.verdict is Verdict.RESUMED and res.sequence == seq

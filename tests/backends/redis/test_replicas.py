"""Two replicas on one Redis (and one Valkey) see one truth.

Two ``ReplayBuffer`` objects with their own connections and the same key
prefix stand for two application replicas behind a load balancer. Whatever
replica a reconnecting client lands on, it must get the same verdict, the
same evidence and the same replay, and a teardown by one replica must be
visible to the other at once.
"""

from __future__ import annotations

from typing import Any

import pytest

from replaystore import ReplayBuffer, UnknownSessionError, Verdict
from replaystore.testing.damage import lose_event
from replaystore.testing.servers import ServerHandle

from ._support import bare, client_of

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

V = Verdict


async def _scenario(url: str, prefix: str) -> None:
    a = ReplayBuffer.from_url(url, prefix=prefix, max_events=6)
    b = ReplayBuffer.from_url(url, prefix=prefix, max_events=6)
    async with a, b:
        assert client_of(a) is not client_of(b)
        info = await a.open_session("s1")
        epoch = info.epoch
        # Both replicas write, interleaved, into one position space.
        alpha = await a.append_many("s1", "alpha", [b"a1", b"a2"])  # 1, 2
        beta = await b.append_many("s1", "beta", [b"b1"])  # 3
        alpha.append(await b.append("s1", "alpha", b"a3"))  # 4
        beta += await a.append_many("s1", "beta", [b"b2", None])  # 5, 6
        alpha.append(await a.append("s1", "alpha", b"a4"))  # 7: evicts 1
        alpha.append(await b.append("s1", "alpha", b"a5"))  # 8: evicts 2
        assert [bare(i) for i in alpha] == [f"{epoch}-{p}" for p in (1, 2, 4, 7, 8)]
        assert [bare(i) for i in beta] == [f"{epoch}-{p}" for p in (3, 5, 6)]
        assert await a.session_info("s1") == await b.session_info("s1")
        floor_info = await b.session_info("s1")
        assert floor_info is not None
        assert (floor_info.floor, floor_info.high_water, floor_info.retained) == (3, 8, 6)

        s2 = await b.open_session("s2")
        s2_ids = await a.append_many("s2", "only", [b"x", b"y", b"z"])
        other_epoch = "0123456789ab" if epoch != "0123456789ab" else "ba9876543210"

        # (session, cursor, named sequence, expected verdict, expected replayed positions)
        table: list[tuple[str, str, str | None, Verdict, list[int] | None]] = [
            ("s1", alpha[2], None, V.RESUMED, [7, 8]),
            ("s1", alpha[2], "alpha", V.RESUMED, [7, 8]),
            ("s1", beta[0], None, V.RESUMED, [5, 6]),
            ("s1", beta[0], "beta", V.RESUMED, [5, 6]),
            ("s1", alpha[4], None, V.RESUMED, []),
            ("s2", f"{s2.epoch}-0", None, V.RESUMED, [1, 2, 3]),
            ("s2", f"{s2.epoch}-0", "only", V.RESUMED, [1, 2, 3]),
            ("s2", s2_ids[0], None, V.RESUMED, [2, 3]),
            ("s1", alpha[0], None, V.BELOW_FLOOR, None),
            ("s1", alpha[1], "alpha", V.RESUMED, [4, 7, 8]),  # alpha's newest evicted event
            ("s1", f"{epoch}-0", "alpha", V.BELOW_FLOOR, None),
            ("s1", f"{epoch}-0", None, V.BELOW_FLOOR, None),
            ("s1", f"{other_epoch}-4", None, V.FOREIGN_CURSOR, None),
            ("s1", s2_ids[0], None, V.FOREIGN_CURSOR, None),
            ("s1", f"{epoch}-9", None, V.AHEAD_OF_HIGH_WATER, None),
            ("s1", f"{epoch}-99999999999999", "alpha", V.AHEAD_OF_HIGH_WATER, None),
            ("s1", beta[0], "alpha", V.SEQUENCE_MISMATCH, None),
            ("s1", alpha[2], "beta", V.SEQUENCE_MISMATCH, None),
            ("s1", alpha[2], "gamma", V.UNKNOWN_SEQUENCE, None),
            ("s1", "not-a-cursor", None, V.MALFORMED_CURSOR, None),
            ("s1", "", None, V.MALFORMED_CURSOR, None),
            ("s1", f"{epoch}-04", None, V.MALFORMED_CURSOR, None),
            ("s1", f"{epoch[:-1]}A-4", None, V.MALFORMED_CURSOR, None),  # upper-case hex
            ("s3", alpha[2], None, V.UNKNOWN_SESSION, None),
            ("s1", f"{s2.epoch}-0", None, V.FOREIGN_CURSOR, None),
        ]
        for session, cursor, named, verdict, positions in table:
            row = (session, cursor, named)
            ra = await a.resolve(session, cursor, named)
            rb = await b.resolve(session, cursor, named)
            assert ra.verdict is verdict, (row, ra)
            assert ra == rb, row
            assert ra.events == [], row  # resolve never replays
            assert not ra.evidence.torn_down, row
            if verdict is V.SEQUENCE_MISMATCH:
                assert ra.evidence.cursor_sequence is not None
            if positions is None:
                continue
            # The replay, from either replica, is the same and exactly the missed events.
            pa = await a.resolve_and_replay(session, cursor, named)
            pb = await b.resolve_and_replay(session, cursor, named)
            assert pa == pb, row
            assert pa.verdict is V.RESUMED, (row, pa)
            assert [e.position for e in pa.events] == positions, row
            assert pa.evidence.replayed == len(positions)

        # Storage damaged behind both replicas' backs: both see the same not_retained.
        await lose_event(a, "s1", 7)
        ra = await a.resolve("s1", alpha[2])
        assert ra.verdict is V.NOT_RETAINED
        assert ra == await b.resolve("s1", alpha[2])

        # A failed replay on replica a tears the session down for replica b too.
        torn = await a.resolve_and_replay("s1", alpha[0])
        assert torn.verdict is V.BELOW_FLOOR
        assert torn.evidence.torn_down
        seen: Any = await b.resolve("s1", beta[0])
        assert seen.verdict is V.UNKNOWN_SESSION
        assert seen.evidence.tombstone is not None
        assert seen.evidence.tombstone.verdict is V.BELOW_FLOOR
        assert seen == await a.resolve("s1", beta[0])
        assert await b.session_info("s1") is None
        with pytest.raises(UnknownSessionError):
            await b.append("s1", "alpha", b"too late")

        # A close by replica b is seen by replica a, with a 'closed' tombstone.
        assert await b.close_session("s2") is True
        closed = await a.resolve_and_replay("s2", s2_ids[0])
        assert closed.verdict is V.UNKNOWN_SESSION
        assert closed.evidence.tombstone is not None
        assert closed.evidence.tombstone.verdict is None
        assert closed.evidence.reason == "the session was closed"
        assert await a.close_session("s2") is False


async def test_two_replicas_agree_on_redis(redis_server: ServerHandle, prefix: str) -> None:
    await _scenario(redis_server.url, prefix)


async def test_two_replicas_agree_on_valkey(valkey_server: ServerHandle, prefix: str) -> None:
    await _scenario(valkey_server.url, prefix)


async def test_two_replicas_agree_on_cluster(cluster_server: ServerHandle, prefix: str) -> None:
    await _scenario(cluster_server.url, prefix)

"""Redis Cluster resharding: a live session's slot moves to another node mid-traffic.

The slot is moved the way ``redis-cli --cluster reshard`` moves it
(``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE ... KEYS``, ``SETSLOT NODE``)
while a writer appends and resumers resume the session. Every call is
redirected (ASK, then MOVED) or told to try again while the slot is half
moved; none may fail, lose or duplicate an event, or get a wrong verdict.
The cluster is this module's own: resharding changes it for everyone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from replaystore import ReplayBuffer, Verdict
from replaystore.testing import ServerHandle, redis_server_binary, start_cluster
from tests.faults.conftest import at

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

RESUMERS = 24


@pytest.fixture(scope="module")
def cluster() -> Iterator[ServerHandle]:
    handle = start_cluster(redis_server_binary(), masters=3)
    yield handle
    handle.stop()


def _node(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


def _owner(handle: ServerHandle, slot: int) -> int:
    with _node(handle.ports[0]) as node:
        for start, end, primary, *_ in node.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
    raise AssertionError(f"slot {slot} has no owner")


def _move_slot(handle: ServerHandle, slot: int, source: int, target: int) -> None:
    """One slot from ``source`` to ``target``, a few keys per MIGRATE, with pauses for traffic."""
    with _node(source) as src, _node(target) as dst:
        src_id = src.execute_command("CLUSTER", "MYID")
        dst_id = dst.execute_command("CLUSTER", "MYID")
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        time.sleep(0.02)  # traffic now meets ASK and TRYAGAIN
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 2):
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
            time.sleep(0.01)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        for port in handle.ports:
            if port not in (source, target):
                with _node(port) as other:
                    other.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


@dataclass
class _Traffic:
    epoch: str
    first: str = ""
    last: int = 0
    acked: list[bytes] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    resumes: int = 0


async def _writer(buf: ReplayBuffer, traffic: _Traffic, moved: asyncio.Event) -> None:
    """Append until the slot has settled, then a few more (through a stale slot map)."""
    after = 0
    while after < 10:
        after += moved.is_set()
        payload = f"e{len(traffic.acked)}".encode()
        eid = await buf.append("live", "w", payload)
        # Same incarnation, a later position (a move may legitimately skip some).
        epoch, position = at(eid)
        if epoch != traffic.epoch or position <= traffic.last:
            traffic.wrong.append(f"append of {payload!r} got id {eid} after {traffic.last}")
        traffic.last = position
        traffic.first = traffic.first or eid
        traffic.acked.append(payload)
        await asyncio.sleep(0.002)


async def _resumer(buf: ReplayBuffer, traffic: _Traffic, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if not traffic.acked:
            await asyncio.sleep(0.002)
            continue
        acked = list(traffic.acked)
        res = await buf.resolve_and_replay("live", traffic.first)
        traffic.resumes += 1
        if res.verdict is not Verdict.RESUMED:
            traffic.wrong.append(f"{res.verdict} {res.evidence.as_dict()}")
            return
        got = [e.payload for e in res.events]
        if got != [f"e{i}".encode() for i in range(1, 1 + len(got))] or len(got) + 1 < len(acked):
            traffic.wrong.append(f"replayed {got} with {len(acked)} acknowledged")
        await asyncio.sleep(0.003)


async def test_slot_moves_under_appends_and_resumes(cluster: ServerHandle, prefix: str) -> None:
    async with ReplayBuffer.from_url(cluster.url, prefix=prefix) as buf:
        info = await buf.open_session("live")
        backend: Any = buf.backend
        base = (
            backend.key_base("live") if hasattr(backend, "key_base") else backend._keys("live")[0]
        )
        slot = int(backend.client.keyslot(base))
        for port in cluster.ports:
            with _node(port) as node:
                node.config_resetstat()

        traffic = _Traffic(info.epoch)
        moved, stop = asyncio.Event(), asyncio.Event()
        writer = asyncio.create_task(_writer(buf, traffic, moved))
        resumers = [asyncio.create_task(_resumer(buf, traffic, stop)) for _ in range(RESUMERS)]
        try:
            owners = [_owner(cluster, slot)]
            targets = [p for p in cluster.ports if p != owners[0]] + [owners[0]]
            for target in targets:
                await asyncio.to_thread(_move_slot, cluster, slot, owners[-1], target)
                owners.append(target)
                await asyncio.sleep(0.05)
            moved.set()
            await writer
        finally:
            moved.set()
            stop.set()
            await asyncio.gather(writer, *resumers)

        assert traffic.wrong == [], traffic.wrong[:5]
        assert _owner(cluster, slot) == owners[-1]
        assert len(owners) == len(cluster.ports) + 1, owners
        assert traffic.resumes > RESUMERS

        final = await buf.resolve_and_replay("live", str(info.origin))
        assert final.verdict is Verdict.RESUMED, final
        assert [e.payload for e in final.events] == traffic.acked
        # A wrong cursor is still judged exactly after the moves.
        ahead = await buf.resolve("live", f"{info.epoch}-{traffic.last + 1}")
        assert ahead.verdict is Verdict.AHEAD_OF_HIGH_WATER

        # The traffic really met the half-moved slot, not just a finished move.
        redirects: dict[str, int] = {}
        for port in cluster.ports:
            with _node(port) as node:
                for name, stats in node.info("errorstats").items():
                    redirects[name] = redirects.get(name, 0) + int(stats["count"])
        assert redirects.get("errorstat_ASK", 0) + redirects.get("errorstat_TRYAGAIN", 0) > 0, (
            redirects
        )
        assert redirects.get("errorstat_MOVED", 0) > 0, redirects

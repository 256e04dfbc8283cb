"""Payloads survive a real server byte for byte: every byte value, empty, 1 MiB, None."""

from __future__ import annotations

import os

import pytest

from replaystore import InvalidInputError, ReplayBuffer, Verdict
from replaystore.testing.servers import ServerHandle

pytestmark = [pytest.mark.anyio, pytest.mark.realserver]

MIB = 1 << 20


def _payloads() -> list[bytes | None]:
    return [
        *(bytes([i]) for i in range(256)),
        bytes(range(256)),
        bytes(range(255, -1, -1)) * 4,
        b"",
        None,
        b"\x00",
        b"\xc0",  # msgpack's nil, as data
        b"\x91\xc0",  # a packed [nil]
        "é\u2028\U0001f600".encode(),
        b"\r\n\r\ndata: x\n\nid: 1\n",
        os.urandom(MIB),
        b"\xff" * MIB,
        b"",
        None,
    ]


@pytest.mark.parametrize("kind", ["redis", "valkey", "cluster"])
async def test_payload_round_trip(kind: str, request: pytest.FixtureRequest, prefix: str) -> None:
    server: ServerHandle = request.getfixturevalue(f"{kind}_server")
    payloads = _payloads()
    async with (
        ReplayBuffer.from_url(server.url, prefix=prefix) as writer,
        ReplayBuffer.from_url(server.url, prefix=prefix) as reader,
    ):
        info = await writer.open_session("s")
        ids = await writer.append_many("s", "bulk", payloads[:200])
        for payload in payloads[200:]:
            ids.append(await writer.append("s", "bulk", payload))
        assert len(ids) == len(payloads)

        replay = await reader.resolve_and_replay("s", f"{info.epoch}-0")
        assert replay.verdict is Verdict.RESUMED
        got = [e.payload for e in replay.events]
        assert len(got) == len(payloads)
        for index, (want, have) in enumerate(zip(payloads, got, strict=True)):
            assert type(have) is type(want), index  # None stays None, b"" stays b""
            assert have == want, index
        assert [e.event_id for e in replay.events] == ids

        # A replay from the middle carries the same bytes.
        tail = await reader.resolve_and_replay("s", ids[-5])
        assert [e.payload for e in tail.events] == payloads[-4:]


async def test_payload_over_the_limit_is_refused_before_storage(
    redis_server: ServerHandle, prefix: str
) -> None:
    async with ReplayBuffer.from_url(redis_server.url, prefix=prefix) as buf:
        await buf.open_session("s")
        with pytest.raises(InvalidInputError):
            await buf.append_many("s", "q", [b"ok", b"x" * (MIB + 1)])
        snapshot = await buf.session_info("s")
        assert snapshot is not None
        assert snapshot.high_water == 0

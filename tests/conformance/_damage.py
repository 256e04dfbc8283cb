"""Losing one stored event behind a backend's back (a bug, an operator, partial data loss).

The only way to reach ``not_retained`` on purpose. The event's slot stays (the
other events keep their places), its content is gone: what a lost element of a
sequence list looks like on Redis, and the same in memory.
"""

from __future__ import annotations

from typing import Any

from replaystore import ReplayBuffer


async def damage_memory(buffer: ReplayBuffer, session: str, position: int) -> None:
    state: Any = buffer.backend._sessions[session]  # type: ignore[attr-defined]
    for seq in state.seqs.values():
        for index, record in enumerate(seq.events):
            if record is not None and record.position == position:
                seq.events[index] = None
                return
    raise AssertionError(f"no event at {position}")


async def damage_redis(buffer: ReplayBuffer, session: str, position: int) -> None:
    backend: Any = buffer.backend
    client = backend.client
    base = backend.key_base(session)
    for field in await client.hkeys(f"{base}:m"):
        if not field.startswith(b"s:"):
            continue
        key = f"{base}:q:{field[2:].decode()}"
        for index, element in enumerate(await client.lrange(key, 0, -1)):
            if element.split(b":", 1)[0].split(b",")[0] == str(position).encode():
                await client.lset(key, index, b"")
                return
    raise AssertionError(f"no event at {position}")

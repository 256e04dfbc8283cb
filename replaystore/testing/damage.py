"""Losing one stored event behind a backend's back: what a bug, an operator or a partial
data loss does to a Redis list, reproduced on purpose.

A resume over such a hole must fail with ``not_retained`` (the rules never
replay around a missing event), and this is the only way to reach that verdict
on purpose. The event's place stays (the other events keep theirs) and its
content is gone, which is what a lost element of a sequence's list looks like
on Redis; the memory backend is damaged the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..backends.memory import MemoryBackend
    from ..backends.redis import RedisBackend
    from ..buffer import ReplayBuffer

__all__ = ["lose_event"]


async def lose_event(buffer: ReplayBuffer, session: str, position: int) -> None:
    """Erase the event stored at ``position`` in ``session``, bypassing the backend's checks.

    Works on ``memory://`` and on every Redis URL (standalone, Valkey, cluster,
    fakeredis). Raises :class:`LookupError` when no retained event of the
    session has that position, and :class:`TypeError` for another backend.
    """
    from ..backends.memory import MemoryBackend

    backend = buffer.backend
    if isinstance(backend, MemoryBackend):
        lost = _lose_in_memory(backend, session, position)
    else:
        from ..backends.redis import RedisBackend  # only a Redis buffer needs redis-py

        if not isinstance(backend, RedisBackend):
            raise TypeError(f"cannot damage a {type(backend).__name__}: memory and Redis only")
        lost = await _lose_in_redis(backend, session, position)
    if not lost:
        raise LookupError(f"session {session!r} holds no event at position {position}")


def _lose_in_memory(backend: MemoryBackend, session: str, position: int) -> bool:
    state = backend._sessions.get(session)
    for seq in state.seqs.values() if state is not None else ():
        for index, record in enumerate(seq.events):
            if record is not None and record.position == position:
                seq.events[index] = None
                return True
    return False


async def _lose_in_redis(backend: RedisBackend, session: str, position: int) -> bool:
    """Empty the list element of the event (``docs/data-layout.md``: ``<position>,<stamp>...``)."""
    client = backend.client
    base = backend.key_base(session)
    wanted = str(position).encode()
    for field in await client.hkeys(f"{base}:m"):
        if not field.startswith(b"s:"):
            continue
        key = f"{base}:q:{field[2:].decode()}"
        for index, element in enumerate(await client.lrange(key, 0, -1)):
            if element.split(b":", 1)[0].split(b",")[0] == wanted:
                await client.lset(key, index, b"")
                return True
    return False

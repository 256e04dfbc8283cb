"""Small helpers shared by the Redis-specific tests."""

from __future__ import annotations

from typing import Any

from replaystore import Cursor, ReplayBuffer
from replaystore.cursor import sequence_tag


def bare(event_id: str) -> str:
    """An event id without its hint: ``<epoch>-<position>``."""
    return str(Cursor.parse(event_id).bare)


def keys_of(buffer: ReplayBuffer, session: str, sequences: tuple[str, ...] = ()) -> list[str]:
    """The fixed keys of ``session`` (meta, index, dirty set, tombstone, idempotency x2)
    and the lists of ``sequences``."""
    backend: Any = buffer.backend
    return list(backend._keys(session, [sequence_tag(s) for s in sequences]))


def key_of(buffer: ReplayBuffer, session: str, suffix: str) -> str:
    """A key of ``session``: ``m`` (meta), ``i`` (run index), ``t`` (tombstone),
    ``q:<tag>`` (a sequence's list) ..."""
    backend: Any = buffer.backend
    return f"{backend.key_base(session)}:{suffix}"


def client_of(buffer: ReplayBuffer) -> Any:
    """The buffer's ``redis.asyncio`` client."""
    backend: Any = buffer.backend
    return backend.client


async def command_calls(client: Any) -> dict[str, int]:
    """``INFO commandstats`` as {command: calls}, without the stats' own INFO/CONFIG calls.

    Redis counts every command a Lua script issues (``redis.call``) under its
    own name, next to the top-level EVALSHA/EVAL that ran the script.
    """
    stats = await client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    return {
        name: n for name, n in calls.items() if not (name == "info" or name.startswith("config"))
    }

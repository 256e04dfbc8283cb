"""Small helpers shared by the Redis-specific tests."""

from __future__ import annotations

from typing import Any

from replaystore import ReplayBuffer


def keys_of(buffer: ReplayBuffer, session: str) -> list[str]:
    """[meta, events, links, tombstone] key names of ``session``."""
    backend: Any = buffer.backend
    return list(backend._keys(session))


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

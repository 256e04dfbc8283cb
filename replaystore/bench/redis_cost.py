"""What the storm costs Redis: server CPU, memory, and where the time went.

Redis CPU is the server's own (``INFO cpu``: ``used_cpu_user`` +
``used_cpu_sys``), as a delta over a phase. It is what sets how many resumes
one Redis core can serve, whatever the clients cost. Memory is the delta of
``used_memory`` over the phase that stored the events. ``INFO commandstats``
(calls and microseconds per command) shows where the server time went. All of
it is only meaningful on a Redis nobody else is using during the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .stores import redis_client

__all__ = ["RedisProbe", "Sample"]


@dataclass(frozen=True, slots=True)
class Sample:
    cpu_s: float
    used_memory: int
    commands: dict[str, tuple[int, int]]  # command -> (calls, usec)

    def minus(self, before: Sample) -> dict[str, Any]:
        stats = {}
        for name, (calls, usec) in self.commands.items():
            c0, u0 = before.commands.get(name, (0, 0))
            if calls - c0 > 0 and name not in ("info", "scan", "unlink", "ping"):
                stats[name] = {"calls": calls - c0, "usec": usec - u0}
        return {
            "cpu_s": self.cpu_s - before.cpu_s,
            "memory_bytes": self.used_memory - before.used_memory,
            "commandstats": dict(sorted(stats.items(), key=lambda kv: -kv[1]["usec"])),
        }


class RedisProbe:
    """A side connection to the storm's Redis for INFO and for cleaning up a store's keys."""

    def __init__(self, url: str) -> None:
        self._r: Any = redis_client(url)

    async def aclose(self) -> None:
        await self._r.aclose()

    async def server(self) -> dict[str, Any]:
        info: dict[str, Any] = await self._r.info("server")
        return {k: info.get(k) for k in ("redis_version", "os", "arch_bits", "process_id")}

    async def sample(self) -> Sample:
        cpu: dict[str, Any] = await self._r.info("cpu")
        memory: dict[str, Any] = await self._r.info("memory")
        stats: dict[str, Any] = await self._r.info("commandstats")
        commands = {
            key.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for key, v in stats.items()
            if isinstance(v, dict)
        }
        return Sample(
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            int(memory["used_memory"]),
            commands,
        )

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key that starts with ``prefix`` (SCAN + UNLINK); return how many."""
        deleted = 0
        batch: list[Any] = []
        async for key in self._r.scan_iter(match=_escape(prefix) + "*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                deleted += await self._r.unlink(*batch)
                batch.clear()
        if batch:
            deleted += await self._r.unlink(*batch)
        return deleted


def _escape(prefix: str) -> str:
    """A glob that matches ``prefix`` literally."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)

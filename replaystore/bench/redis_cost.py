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

from .stores import node_urls, redis_client

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
    """Side connections to the storm's Redis for INFO and for cleaning up a store's keys.

    On a Redis Cluster one connection per node the URL lists (every master, as
    the storm expects), and every figure is the sum over them.
    """

    def __init__(self, url: str) -> None:
        self._nodes: list[Any] = [redis_client(u) for u in node_urls(url)]

    async def aclose(self) -> None:
        for r in self._nodes:
            await r.aclose()

    async def server(self) -> dict[str, Any]:
        info: dict[str, Any] = await self._nodes[0].info("server")
        out = {k: info.get(k) for k in ("redis_version", "os", "arch_bits", "process_id")}
        if len(self._nodes) > 1:
            out["nodes"] = len(self._nodes)
        return out

    async def sample(self) -> Sample:
        cpu_s = 0.0
        used = 0
        commands: dict[str, tuple[int, int]] = {}
        for r in self._nodes:
            cpu: dict[str, Any] = await r.info("cpu")
            memory: dict[str, Any] = await r.info("memory")
            stats: dict[str, Any] = await r.info("commandstats")
            cpu_s += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
            used += int(memory["used_memory"])
            for key, v in stats.items():
                if isinstance(v, dict):
                    name = key.removeprefix("cmdstat_")
                    calls, usec = commands.get(name, (0, 0))
                    commands[name] = (calls + int(v["calls"]), usec + int(v["usec"]))
        return Sample(cpu_s, used, commands)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key that starts with ``prefix`` (SCAN + UNLINK); return how many.

        One key per UNLINK: a cluster node refuses a command whose keys are in
        different slots, even slots of its own.
        """
        deleted = 0
        for r in self._nodes:
            batch: list[Any] = []
            async for key in r.scan_iter(match=_escape(prefix) + "*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += await _unlink(r, batch)
                    batch.clear()
            if batch:
                deleted += await _unlink(r, batch)
        return deleted


async def _unlink(r: Any, keys: list[Any]) -> int:
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)
    return sum(int(n) for n in await pipe.execute())


def _escape(prefix: str) -> str:
    """A glob that matches ``prefix`` literally."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)

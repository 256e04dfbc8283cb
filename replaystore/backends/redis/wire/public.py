"""The transport through redis-py's public API: every command as redis-py sends it.

For every client the direct transports do not handle (a fake, a connection
class of an application's own, a redis-py that lacks a name :mod:`..redispy`
checks) and, on a cluster, for everything but a resume's read
(:mod:`.routing`). Slower than by hand, same results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .packets import Commands

__all__ = ["PublicWire"]


class PublicWire:
    """How one backend's commands reach Redis through redis-py's client."""

    #: redis-py's public API holds no connection between two packets.
    transactions = None

    def __init__(self, client: Any) -> None:
        self.client = client

    async def command(self, command: tuple[Any, ...]) -> Any:
        return await self.client.execute_command(*command)

    async def call(self, packet: bytes, command: Callable[[], Sequence[Any]]) -> Any:
        return await self.client.execute_command(*command())

    async def pipeline(
        self, commands: Sequence[tuple[Any, ...]], *, slack: float = 0.0
    ) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))

    async def shared_pipeline(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        return await self.pipeline(commands)

    async def keyless(self, commands: Sequence[tuple[Any, ...]]) -> None:
        for command in commands:  # a cluster's pipeline wants a key to route each command by
            await self.command(command)

    async def read(self, key: str, packet: bytes, replies: int, commands: Commands) -> list[Any]:
        return await self.pipeline(commands())

    async def give_back(self) -> None:
        """Nothing is kept: redis-py gives each connection back itself."""

"""``subscriptions/listen`` events in a Redis stream that every replica reads by position.

A publish is one script: a counter incremented and an ``XADD`` trimmed to
``keep`` entries. Each replica reads with a blocking ``XREAD`` from the last
entry it delivered (one pending read per replica, renewed every few seconds
when nothing happens), so a dropped connection loses nothing: the reader
continues from its position. Every entry carries the counter, so a replica
that fell more than ``keep`` events behind knows it (logged and counted in
``gaps``) instead of skipping silently.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel

from ..errors import STORE_ERRORS, mapped
from ..keys import listen
from .outage import StoreWatch

__all__ = ["RedisEventLog"]

logger = logging.getLogger("replaystore.mcp.subscriptions")

_PUBLISH = """
local n = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'n', n, 'e', ARGV[1])
return n
"""


class RedisEventLog:
    """The listen events of one Redis and prefix: a stream and its counter."""

    def __init__(
        self,
        client: Any,
        key_base: Callable[[str], str],
        *,
        keep: int,
        block: float | None,
        watch: StoreWatch,
    ) -> None:
        self._client = client
        self._watch = watch
        self._stream, self._counter = listen(key_base)
        self._keep = keep
        self._block = block
        self.gaps = 0

    async def publish(self, text: str) -> None:
        with mapped("publishing a listen event", self._client):
            await self._client.eval(_PUBLISH, 2, self._stream, self._counter, text, self._keep)

    @asynccontextmanager
    async def reading(self, deliver: Callable[[str], None]) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            start = await self._tip()
            group.start_soon(self._read, deliver, start)
            try:
                yield
            finally:
                group.cancel_scope.cancel()

    async def _tip(self) -> tuple[str, int]:
        """Where this replica starts reading: after the newest stored event."""
        try:
            newest = await self._client.xrevrange(self._stream, count=1)
            count = await self._client.get(self._counter)
        except STORE_ERRORS as exc:
            logger.warning("listen events: cannot read the stream's end: %s", exc)
            return "$", -1
        last = _text(newest[0][0]) if newest else "0-0"
        return last, int(count) if count is not None and newest else -1

    async def _read(self, deliver: Callable[[str], None], start: tuple[str, int]) -> None:
        last, seen = start
        block_ms = int((self._block or _longest_wait(self._client)) * 1000)
        while True:
            try:
                reply = await self._client.xread({self._stream: last}, count=500, block=block_ms)
            except STORE_ERRORS as exc:  # connection lost: retry from the same position
                self._watch.failed("listen events: read failed, retrying", exc)
                await anyio.sleep(0.5)
                continue
            if self._watch.failing:
                await self._watch.back()
            for _stream, entries in reply or ():
                for entry_id, fields in entries:
                    last = _text(entry_id)
                    values = {_text(k): _text(v) for k, v in fields.items()}
                    number = int(values.get("n", "0"))
                    if seen >= 0 and number > seen + 1:
                        self.gaps += number - seen - 1
                        logger.warning(
                            "listen events: %d event(s) trimmed before this replica read them",
                            number - seen - 1,
                        )
                    seen = number
                    deliver(values.get("e", ""))
            await anyio.lowlevel.checkpoint()


def _longest_wait(client: Any) -> float:
    """How long a blocking read may wait on ``client``: its reply timeout, less a second."""
    settings = getattr(client, "get_connection_kwargs", None)
    # None: a client without redis-py's connection settings.
    timeout = settings().get("socket_timeout") if settings is not None else None
    if timeout is None:
        return 60.0
    return max(0.1, min(60.0, float(timeout) - 1.0))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

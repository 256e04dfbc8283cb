"""Wake-ups of task event streams: one ``PSUBSCRIBE`` per store (:class:`EventWakeups`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio

from ...notifications import hint
from ..errors import STORE_ERRORS

__all__ = ["LINGER", "EventWakeups"]

logger = logging.getLogger(__name__)

#: Seconds the subscription stays up after its last reader left. A resume is
#: a new ``tasks/stream`` request, and a finished task's stream ends at once:
#: without the wait, every resume would open a connection, subscribe and close
#: it again, which costs Redis several times the read itself.
LINGER: Final = 10.0


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class EventWakeups:
    """One ``PSUBSCRIBE`` per store to every task's event channel, while readers come.

    Started by the first reader and stopped :data:`LINGER` seconds after the
    last one left (or at once when its connection fails with no reader
    waiting): a replica that serves no task stream holds no connection for
    it, and one that serves resumes one after the other subscribes once.
    Every append publishes on its task's channel; the listener calls the
    waiting readers of that task. A hint only (readers read the store on a
    timer too), so a message lost while the connection is down costs
    latency, never an event.
    """

    def __init__(self, client: Any, pattern: str, head: str, tail: str) -> None:
        self._client = client
        self._pattern = pattern
        self._head = head
        self._tail = tail
        self._waiting: dict[str, list[Callable[[], None]]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        #: The event loop's time when the last reader left; None while any reader waits.
        self._idle_since: float | None = None

    @asynccontextmanager
    async def watch(self, task_id: str, wake: Callable[[], None]) -> AsyncIterator[None]:
        self._waiting.setdefault(task_id, []).append(wake)
        self._idle_since = None
        if self._listener is None or self._listener.done():
            self._ready = asyncio.Event()
            self._listener = asyncio.get_running_loop().create_task(self._listen())
            # Subscribed before the first reader reads, so no append after its
            # read goes unheard; a subscription that fails (or is slow) only
            # leaves the readers to their timer, and is waited for once.
            with anyio.move_on_after(1.0):
                await self._ready.wait()
        try:
            yield
        finally:
            waiting = self._waiting.get(task_id, [])
            if wake in waiting:
                waiting.remove(wake)
            if not waiting:
                self._waiting.pop(task_id, None)
            if not self._waiting:
                self._idle_since = asyncio.get_running_loop().time()

    def _stop(self, *, failed: bool) -> bool:
        """Whether the listener ends now: no reader waits, and it failed or lingered enough.

        Decided and recorded with no wait in between, so a reader that comes
        after it starts a listener of its own.
        """
        if self._waiting:
            return False
        idle = self._idle_since
        if not failed and (idle is None or asyncio.get_running_loop().time() - idle < LINGER):
            return False
        if self._listener is asyncio.current_task():
            self._listener = None
        return True

    async def _listen(self) -> None:
        pubsub = self._client.pubsub()
        try:
            while True:
                try:
                    if not self._ready.is_set():
                        await pubsub.psubscribe(self._pattern)
                        while True:
                            raw = await pubsub.get_message(timeout=1.0)
                            if raw is not None and raw.get("type") == "psubscribe":
                                break
                        self._ready.set()
                    raw = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                except STORE_ERRORS as exc:
                    if self._stop(failed=True):
                        return  # nobody to wake: the next reader subscribes again
                    logger.debug("task event wake-ups interrupted (%s); reconnecting", exc)
                    self._ready.clear()
                    await anyio.sleep(0.5)
                    continue
                if self._stop(failed=False):
                    return
                if raw is None or raw.get("type") != "pmessage":
                    continue
                channel = _text(raw.get("channel") or b"")
                task_id = channel[len(self._head) : len(channel) - len(self._tail)]
                for wake in list(self._waiting.get(task_id, ())):
                    # A hint: the reader reads on a timer anyway.
                    hint(wake, about=f"waking a reader of task {task_id}")
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                try:
                    await pubsub.aclose()
                except STORE_ERRORS:
                    logger.debug("closing the wake-up connection failed", exc_info=True)

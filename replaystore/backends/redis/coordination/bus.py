"""Notifications between replicas over Redis pub/sub, on one dedicated connection per replica.

On a cluster, ``PUBLISH`` reaches subscribers on every node. Wake-ups are
coalesced and published by one background task, so an append never waits
for them; a lost one costs latency only (tails re-check the store). What
is published goes over the backend's wire (:class:`..wire.Wire`): one
``PUBLISH`` through redis-py's client costs a replica about as much CPU as a
resume's own read, and the wake-ups of a batch go in one packet.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import anyio
import anyio.abc

from ...notifications import Bus, Gap, Handler, Message, Wake, decode, encode
from ..errors import STORE_ERRORS, mapped, storage_error
from ..keys import all_channel, replica_channel, session_channel
from ..wire import Wire
from .outage import StoreWatch

__all__ = ["RedisBus"]

logger = logging.getLogger("replaystore.mcp")


#: What interrupts the pub/sub connection: the store's errors, and the
#: ``RuntimeError`` redis-py's pub/sub raises when it reconnects while a
#: subscription sent from another task reads the same new connection
#: (asyncio's "read() called while another coroutine is already waiting"):
#: the connection is lost and being replaced, so the listening loop and the
#: subscribing requests treat it as the interruption it is (the loop
#: reconnects, a tail re-reads the store on its timer), never as a bug.
_INTERRUPTED: tuple[type[BaseException], ...] = (*STORE_ERRORS, RuntimeError)


class RedisBus(Bus):
    """Classic pub/sub on one dedicated connection per replica."""

    def __init__(
        self, replica: str, handler: Handler, wire: Wire, prefix: str, watch: StoreWatch
    ) -> None:
        super().__init__(replica, handler)
        self._watch = watch
        self._wire = wire
        self._client = wire.client  # the subscriptions' dedicated connection comes from it
        self._session_channel = partial(session_channel, prefix)
        self._replica_channel = partial(replica_channel, prefix)
        self._all = all_channel(prefix)
        self._mine = self._replica_channel(replica)
        self._pubsub: Any = None  # redis-py's PubSub (untyped)
        self._pending: dict[tuple[str, str], None] = {}
        self._kick = anyio.Event()
        self._confirmed: dict[str, anyio.Event] = {}

    def _channel(self, session: str) -> str:
        return self._session_channel(session)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._pubsub = self._client.pubsub()
        try:
            with mapped("subscribing to the replicas' channels"):
                await self._pubsub.subscribe(self._all, self._mine)
            await self._watch.arm()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._publisher)
                task_status.started()
                await self._listen()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                try:
                    await self._pubsub.aclose()
                except STORE_ERRORS:
                    logger.debug("closing the notification connection failed", exc_info=True)

    async def _listen(self) -> None:
        while True:
            try:
                raw = await self._pubsub.get_message(ignore_subscribe_messages=False, timeout=1.0)
            except _INTERRUPTED as exc:
                self._watch.failed("replica notifications interrupted; reconnecting", exc)
                # A subscription sent meanwhile gets no confirmation (Redis may
                # have refused it: busy, loading): whoever waits for one reads
                # the store now, and hears what the store says.
                for confirmed in self._confirmed.values():
                    confirmed.set()
                self._confirmed.clear()
                await anyio.sleep(0.5)
                self._handler(Gap())  # what was published meanwhile is lost
                continue
            if self._watch.failing:
                await self._watch.back()
            if raw is None:
                continue
            kind = raw.get("type")
            channel = raw.get("channel")
            channel = channel.decode() if isinstance(channel, bytes) else str(channel)
            if kind == "subscribe":
                event = self._confirmed.pop(channel, None)
                if event is not None:
                    event.set()
                continue
            if kind != "message":
                continue
            decoded = decode(raw.get("data", b""))
            if decoded is not None:
                self._deliver(*decoded)

    async def _publisher(self) -> None:
        while True:
            await self._kick.wait()
            self._kick = anyio.Event()
            batch, self._pending = list(self._pending), {}
            commands = [
                ("PUBLISH", self._channel(session), encode(Wake(session, stream), self.replica))
                for session, stream in batch
            ]
            try:
                await self._wire.keyless(commands)
            except STORE_ERRORS as exc:
                # A lost wake-up costs latency only: tails re-check the store periodically.
                logger.debug("wake-up(s) not published: %s", exc)

    async def _subscribe(self, session: str) -> None:
        if self._pubsub is None:
            return
        channel = self._channel(session)
        confirmed = self._confirmed[channel] = anyio.Event()
        try:
            await self._pubsub.subscribe(channel)
        except _INTERRUPTED as exc:
            # The wake-ups of this session may be missed: its tails re-read the store on a timer.
            logger.debug("subscribing to session %s interrupted: %r", session, exc)
            return
        # Subscribe first, then read the store: wait (briefly) for the
        # subscription to be active so no wake-up falls in between.
        with anyio.move_on_after(1.0):
            await confirmed.wait()

    async def _unsubscribe(self, session: str) -> None:
        if self._pubsub is None:
            return
        try:
            await self._pubsub.unsubscribe(self._channel(session))
        except _INTERRUPTED as exc:
            logger.debug("unsubscribing from session %s failed: %s", session, exc)

    def wake(self, session: str, stream: str) -> None:
        self._pending[(session, stream)] = None
        self._kick.set()

    async def broadcast(self, message: Message) -> None:
        await self._publish(self._all, message)

    async def send(self, replica: str, message: Message) -> None:
        await self._publish(self._replica_channel(replica), message)

    async def _publish(self, channel: str, message: Message) -> None:
        text = encode(message, self.replica)
        try:
            await self._wire.command(("PUBLISH", channel, text))
        except STORE_ERRORS as exc:
            said = storage_error("publishing", exc)
            logger.warning("could not notify the other replicas: %s", said)

"""``requestState`` sealed under a key every replica shares, kept in the store.

On 2026-07-28 a tool may answer ``tools/call`` with an ``InputRequiredResult``
carrying ``requestState``; the client sends it back with its answers, to
whichever replica the balancer picks. The SDK seals that state (AES-GCM) and
refuses any token it cannot open: ``MCPServer`` uses a key made by each
process unless the application passes its own, so behind a balancer the
second round of a multi-round call fails on every other replica with
"Invalid or expired requestState".

:class:`StoreKeyRing` is a ``RequestStateCodec`` whose key lives in the
store of the app's buffer: the first replica to start creates it in one
atomic step (``SET NX`` on Redis; the backend's coordination keeps it), every
other replica reads that one.
Sealing and opening stay the SDK's own AES-256-GCM codec; only where the key
comes from changes. Each replica checks the key again every
``refresh`` seconds, so a store that lost it (restarted empty) gets one again
and every replica converges on it, while tokens sealed under a key a replica
held before still open there until they expire.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from mcp.server.request_state import (
    AESGCMRequestStateCodec,
    InvalidRequestState,
    RequestStateCodec,
)

from ..backends.coordination import Coordination, coordination_of
from ..buffer import ReplayBuffer

__all__ = ["DEFAULT_REFRESH", "StoreKeyRing"]

logger = logging.getLogger(__name__)

#: Seconds between two checks of the shared key.
DEFAULT_REFRESH = 30.0

#: Keys a replica keeps to open tokens sealed before the shared key changed.
_KEPT = 4


class StoreKeyRing:
    """A ``RequestStateCodec`` sealing under the key kept in the store (see the module docstring).

    ``fallback``: a codec that also opens tokens (the server's own, so that
    tokens it sealed before this ring took over still open here). Until the
    key is loaded (when the app starts), sealing raises and opening refuses:
    the SDK then answers an internal error, never an unprotected state.
    """

    def __init__(
        self, *, fallback: RequestStateCodec | None = None, refresh: float = DEFAULT_REFRESH
    ) -> None:
        if not refresh > 0:
            raise ValueError("refresh must be a positive number of seconds")
        self.refresh = refresh
        self._fallback = fallback
        self._coordination: Coordination | None = None
        self._keys: list[str] = []
        self._codec: AESGCMRequestStateCodec | None = None

    def bind(self, buffer: ReplayBuffer) -> None:
        """Keep the key in the store of ``buffer``."""
        if self._coordination is None:
            self._coordination = coordination_of(buffer.backend)

    @property
    def loaded(self) -> bool:
        """Whether the shared key has been read (tokens can be sealed)."""
        return self._codec is not None

    # -- the RequestStateCodec protocol ----------------------------------------------

    def seal(self, payload: bytes) -> str:
        codec = self._codec
        if codec is None:
            raise RuntimeError("the shared requestState key is not loaded yet")
        return codec.seal(payload)

    def unseal(self, token: str) -> bytes:
        codec = self._codec
        if codec is not None:
            try:
                return codec.unseal(token)
            except InvalidRequestState:
                if self._fallback is None:
                    raise
        if self._fallback is None:
            raise InvalidRequestState("no key loaded")
        return self._fallback.unseal(token)

    # -- the key in the store ----------------------------------------------------------

    async def load(self) -> None:
        """Read the shared key (creating it if the store has none) and seal under it."""
        coordination = self._coordination
        if coordination is None:
            raise RuntimeError("StoreKeyRing has no store: pass the buffer to the app")
        mine = self._keys[0] if self._keys else secrets.token_hex(32)
        shared = await coordination.request_state_key(mine)
        if not self._keys or self._keys[0] != shared:
            if self._keys:
                logger.info("requestState: the shared key changed; older tokens still open here")
            self._keys = [shared, *[k for k in self._keys if k != shared]][:_KEPT]
            self._codec = AESGCMRequestStateCodec(self._keys)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Load the key before serving, and check it every ``refresh`` seconds while open.

        A store that does not answer at start does not stop the app: the key
        is loaded in the background as soon as it answers (until then a
        multi-round call is answered an internal error).
        """
        try:
            await self.load()
        except Exception as exc:
            logger.warning("requestState: the shared key cannot be read yet: %s", exc)
        async with anyio.create_task_group() as group:
            group.start_soon(self._refreshing)
            try:
                yield
            finally:
                group.cancel_scope.cancel()

    async def _refreshing(self) -> None:
        failed = False
        while True:
            await anyio.sleep(self.refresh if self.loaded else min(1.0, self.refresh))
            try:
                await self.load()
            except Exception as exc:
                if not failed:
                    logger.warning("requestState: the shared key cannot be read: %s", exc)
                failed = True
            else:
                failed = False

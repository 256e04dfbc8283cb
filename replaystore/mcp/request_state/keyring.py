"""``requestState`` sealed under a key every replica shares, kept in the store.

On 2026-07-28 a tool may answer ``tools/call`` with an ``InputRequiredResult``
carrying ``requestState``; the client sends it back with its answers, to
whichever replica the balancer picks. The SDK seals that state (AES-GCM) and
refuses any token it cannot open: ``MCPServer`` uses a key made by each
process unless the application passes its own, so behind a balancer the
second round of a multi-round call fails on every other replica with
"Invalid or expired requestState".

:class:`StoreKeyRing` is a ``RequestStateCodec`` whose key every replica
finds in the store of the app's buffer: the first replica to start stores a
random value in one atomic step (``SET NX`` on Redis, no TTL; the backend's
coordination keeps it), every other replica reads that one.

- **With an operator's secret** (``secret=``, or the
  ``REPLAYSTORE_REQUEST_STATE_SECRET`` environment variable), the key is
  HKDF-SHA256 of the secret salted with the stored value: reading the store
  is not enough to open or forge a token. Several secrets (a list, or
  separated by spaces in the variable) rotate it: the first seals, every
  one opens.
- **Without one**, the stored value is the key itself: anyone who can read
  the store can open and forge tokens.

Sealing and opening stay the SDK's own AES-256-GCM codec; only where the key
comes from changes. Each replica checks the stored value again every
``refresh`` seconds. A store that lost it (evicted, flushed, restarted empty)
is told in an error naming the store's eviction policy, and the replica
stores the value it holds again, so tokens sealed before keep opening
everywhere; a value another replica stored meanwhile is adopted (with an
error too), and tokens sealed under a value a replica held before still open
there until they expire.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from mcp.server.request_state import (
    AESGCMRequestStateCodec,
    InvalidRequestState,
    RequestStateCodec,
)

from ...backends.coordination import Coordination, coordination_of
from ...buffer import ReplayBuffer

__all__ = ["DEFAULT_REFRESH", "SECRET_VARIABLE", "Secret", "StoreKeyRing"]

logger = logging.getLogger(__name__)

#: Seconds between two checks of the shared key.
DEFAULT_REFRESH = 30.0

#: The environment variable holding the operator's secret(s), separated by spaces.
SECRET_VARIABLE = "REPLAYSTORE_REQUEST_STATE_SECRET"

#: An operator's secret, or several (the first seals, every one opens).
Secret = str | bytes | Sequence[str | bytes]

#: Keys a replica keeps to open tokens sealed before the shared key changed.
_KEPT = 4

#: Shortest secret accepted, in bytes (the SDK's own rule for its keys).
_SHORTEST = 32

_INFO = b"replaystore/request-state/v1"


def secrets_of(secret: Secret | None) -> list[bytes]:
    """The operator's secrets: ``secret``, else the environment variable's; [] for none.

    ``ValueError`` for a secret shorter than 32 bytes: a short one is
    guessable, and a replica must not start sealing under it.
    """
    if secret is None:
        secret = os.environ.get(SECRET_VARIABLE, "").split()
    found = [secret] if isinstance(secret, (str, bytes)) else list(secret)
    material = [s.encode() if isinstance(s, str) else bytes(s) for s in found]
    for value in material:
        if len(value) < _SHORTEST:
            raise ValueError(
                f"a requestState secret must be at least {_SHORTEST} bytes of secret randomness "
                f"(one is {len(value)}); make one with: "
                'python -c "import secrets; print(secrets.token_hex(32))"'
            )
    return material


def derive(secret: bytes, stored: str) -> bytes:
    """The key sealing tokens: HKDF-SHA256 of the operator's ``secret``, salted by ``stored``."""
    return HKDF(algorithm=SHA256(), length=32, salt=stored.encode(), info=_INFO).derive(secret)


class StoreKeyRing:
    """A ``RequestStateCodec`` sealing under the key kept in the store (see the module docstring).

    ``fallback``: a codec that also opens tokens (the server's own, so that
    tokens it sealed before this ring took over still open here).
    ``secret``: the operator's secret(s) the key is derived from (by
    default the ``REPLAYSTORE_REQUEST_STATE_SECRET`` environment variable;
    none: the stored value is the key). Until the key is loaded (when the
    app starts), sealing raises and opening refuses: the SDK then answers an
    internal error, never an unprotected state.
    """

    def __init__(
        self,
        *,
        fallback: RequestStateCodec | None = None,
        refresh: float = DEFAULT_REFRESH,
        secret: Secret | None = None,
    ) -> None:
        if not refresh > 0:
            raise ValueError("refresh must be a positive number of seconds")
        self.refresh = refresh
        self._fallback = fallback
        self._secrets = secrets_of(secret)
        self._coordination: Coordination | None = None
        self._stored: str | None = None  # the store's value this replica seals under
        self._keys: list[bytes] = []
        self._codec: AESGCMRequestStateCodec | None = None

    def bind(self, buffer: ReplayBuffer) -> None:
        """Keep the key in the store of ``buffer``."""
        if self._coordination is None:
            self.keep_in(coordination_of(buffer.backend))

    def keep_in(self, coordination: Coordination) -> None:
        """Keep the key through ``coordination`` (the store's), unless already bound."""
        if self._coordination is None:
            self._coordination = coordination

    @property
    def loaded(self) -> bool:
        """Whether the shared key has been read (tokens can be sealed)."""
        return self._codec is not None

    @property
    def derived(self) -> bool:
        """Whether the key is derived from an operator's secret (the store alone cannot forge)."""
        return bool(self._secrets)

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
        """Read the shared key (storing one if the store has none) and seal under it.

        A store that lost the value this replica holds gets it back, told in
        an error: a new one is never made silently while one is held.
        """
        coordination = self._coordination
        if coordination is None:
            raise RuntimeError("StoreKeyRing has no store: pass the buffer to the app")
        held = self._stored
        stored, created = await coordination.request_state_key(held or secrets.token_hex(32))
        if held is not None and created:
            logger.error(
                "requestState: the shared key was missing from the store (%s); this replica "
                "stored the one it holds again, so tokens sealed before still open",
                await _why_lost(coordination),
            )
        elif held is not None and stored != held:
            logger.error(
                "requestState: the shared key in the store was replaced (it was lost, then "
                "made again by another replica: %s); sealing under the new one, tokens sealed "
                "under the old one open only on replicas that still hold it",
                await _why_lost(coordination),
            )
        if stored == held:
            return
        self._stored = stored
        made = [derive(s, stored) for s in self._secrets] or [stored.encode()]
        self._keys = [*made, *[k for k in self._keys if k not in made]][: _KEPT + len(made) - 1]
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


async def _why_lost(coordination: Coordination) -> str:
    """What the store says of its eviction policy, for the error telling a lost key."""
    try:
        warning = await coordination.eviction_warning()
    except Exception as exc:
        return f"its eviction policy cannot be read: {exc}"
    if warning is None:
        return "the store does not evict: it was flushed or restarted empty"
    return warning

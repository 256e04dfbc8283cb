"""A Redis that stops answering, as a replica's log tells it: when, how long, and what came back.

Every replica reads the store without pause (the notifications between
replicas, the listen events): when Redis stops answering, each of those
loops fails and retries about twice a second. They log through one
:class:`~replaystore.backends.outages.OutageLog` per store and process, so an outage
is one line when it begins, one per period while it lasts, and one when the
store answers again, and that last line says whether the store came back
**empty** (restarted without its data, or failed over to a replica that had
none): then every session, task and listen event held before is gone, and
clients get 404 and start over.

"Empty" is read from a marker key (:func:`~..keys.store_marker`) holding a
random token: set once when the first replica starts, read again after an
outage. Missing, or another token (a replica that came back first wrote a
new one), the store lost its keys. (An eviction policy that may evict it
would say "empty" wrongly; the start-up check warns about such a policy.)
"""

from __future__ import annotations

import logging
import secrets
import weakref
from typing import Any

from ...outages import OutageLog
from ..errors import STORE_ERRORS
from ..keys import store_marker

__all__ = ["StoreWatch", "watch_of"]

logger = logging.getLogger("replaystore.mcp")

#: One watch per client and key prefix: the loops of one store share its lines.
_watches: weakref.WeakKeyDictionary[Any, dict[str, StoreWatch]] = weakref.WeakKeyDictionary()


def watch_of(client: Any, prefix: str) -> StoreWatch:
    """The watch of the store ``client`` reaches, for the keys under ``prefix``."""
    per_prefix = _watches.setdefault(client, {})
    watch = per_prefix.get(prefix)
    if watch is None:
        watch = per_prefix[prefix] = StoreWatch(client, prefix)
    return watch


class StoreWatch:
    """The outage lines of one store, and the marker that tells an empty store from a kept one."""

    def __init__(self, client: Any, prefix: str, log: OutageLog | None = None) -> None:
        self._client = client
        self._marker = store_marker(prefix)
        self._log = log if log is not None else OutageLog(logger, "the replay store")
        self._token: str | None = None  # the marker's token as this replica last read it
        self._checking = False

    @property
    def failing(self) -> bool:
        return self._log.failing

    async def arm(self) -> None:
        """Read the marker (set it if the store has none): what a later check compares with."""
        try:
            self._token = await self._read_or_set()
        except STORE_ERRORS as exc:  # the loops that need the store say it again
            logger.debug("the store marker could not be read: %s", exc)

    def failed(self, what: str, exc: BaseException) -> None:
        """A call of one of the store's loops failed (``what`` it was)."""
        self._log.failed(f"{what}: {exc}")

    async def back(self) -> None:
        """A call succeeded after failures: say once that the store answers, and with what."""
        if not self._log.failing or self._checking:
            return
        self._checking = True
        try:
            try:
                token = await self._read_or_set()
            except STORE_ERRORS:  # not back after all: the next failure says so
                return
            known, self._token = self._token, token
            if known is None:  # never read before: nothing to compare with
                self._log.succeeded()
            elif token != known:
                note = (
                    "it came back EMPTY: every session, task and listen event it held is "
                    "gone (clients get 404 and start over)"
                )
                if self._log.reported:
                    self._log.succeeded(note)
                else:  # a blip the log did not report: this must be said all the same
                    self._log.succeeded()
                    logger.warning("the replay store answers again; %s", note)
            else:
                self._log.succeeded("its data is still there")
        finally:
            self._checking = False

    async def _read_or_set(self) -> str:
        await self._client.set(self._marker, secrets.token_hex(8), nx=True)
        raw = await self._client.get(self._marker)
        return raw.decode() if isinstance(raw, bytes) else str(raw)

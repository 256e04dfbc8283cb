"""What a client and the log are told when the store fails a request: what the store said.

A store that does not answer (down, partitioned, too slow) and one that
answers "no" (out of memory, a read-only replica, a command its ACL forbids)
both end a request with ``503`` and ``Retry-After``: the verdict is unknown
and the session is kept. They are told apart in the words, so that an
operator reading a client's error or the log knows what to fix.
"""

from __future__ import annotations

from typing import Any

from ..errors import StorageError

__all__ = ["store_trouble", "unavailable_error"]

#: Longest text of the store's error repeated to a client or the log.
_LIMIT = 256


def store_trouble(exc: BaseException | None) -> str:
    """One phrase for the log and for clients: why the store did not serve the request."""
    if not isinstance(exc, StorageError) or exc.kind == "unreachable":
        detail = f" ({str(exc)[:_LIMIT]})" if exc is not None and str(exc) else ""
        return f"the replay store did not answer (unreachable or too slow){detail}"
    if exc.kind == "unreplicated":
        return f"the replay store could not make it durable: {str(exc)[:_LIMIT]}"
    nature = "permanently refused" if exc.permanent else "refused"
    return f"the replay store {nature} it: {str(exc)[:_LIMIT]}"


def unavailable_error(
    exc: BaseException | None, *, resumption: bool = False
) -> tuple[str, dict[str, Any]]:
    """The message and ``data`` of the JSON-RPC error a ``503`` carries for ``exc``."""
    detail = "the resumption verdict is unknown, " if resumption else ""
    message = f"Service Unavailable: {store_trouble(exc)}; {detail}retry later"
    data: dict[str, Any] = {"verdict": None, "reason": "storage_error"}
    if isinstance(exc, StorageError):
        data["store"] = exc.kind
    return message, data

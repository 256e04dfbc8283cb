"""``wait_replicas``: an append returns only once enough replicas acknowledged it.

Redis replicates asynchronously; a failover to a replica that had not
received the newest appends loses them. ``WAIT`` sent right behind the
append, on the same connection, makes the append's success mean "on the
primary and on ``wait_replicas`` replicas", so a failover to one of them
loses nothing that was acknowledged. An append that fewer replicas
acknowledged within ``wait_timeout`` fails with :class:`StorageError` (it is
stored on the primary, and a client may still see it; the caller only learns
that it is not known to be durable).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import StorageError, UnsupportedURLError

__all__ = ["append_and_wait", "options_from"]

#: The append statuses that stored something (``append.lua``).
_STORED = (b"ok", b"full")


async def append_and_wait(
    call: Callable[[Callable[[tuple[Any, ...]], Awaitable[Any]]], Awaitable[Any]],
    pipeline: Callable[..., Awaitable[list[Any]]],
    replicas: int,
    wait_s: float,
) -> Any:
    """The append ``call`` makes and ``WAIT`` in one round trip, on one connection.

    ``call`` runs the append through a sender it is given (the script
    library's fallbacks); ``pipeline`` is the wire's. The reply comes within
    ``wait_s`` plus the socket timeout, whatever the replicas do.
    """
    wait = ("WAIT", replicas, round(wait_s * 1000))

    async def send(command: tuple[Any, ...]) -> Any:
        out, acked = await pipeline([command, wait], slack=wait_s)
        if isinstance(out, Exception):
            raise out
        if isinstance(acked, Exception):
            raise acked
        if out and out[1] in _STORED and int(acked) < replicas:
            raise StorageError(
                f"append stored on the primary but acknowledged by {acked} of "
                f"{replicas} replica(s) within {wait_s:g} s (wait_replicas)"
            )
        return out

    return await call(send)


def options_from(url: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Take ``wait_replicas``/``wait_timeout`` out of the URL query and the options."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    found = {k: v for k, v in query if k in ("wait_replicas", "wait_timeout")}
    rest = [(k, v) for k, v in query if k not in found]
    out: dict[str, Any] = {}
    try:
        if "wait_replicas" in found:
            out["wait_replicas"] = int(found["wait_replicas"])
        if "wait_timeout" in found:
            out["wait_timeout"] = float(found["wait_timeout"])
    except ValueError as exc:
        raise UnsupportedURLError(f"bad durability option in {url!r}: {exc}") from exc
    for name in ("wait_replicas", "wait_timeout"):
        if name in options:
            out[name] = options.pop(name)
    return urlunsplit(parts._replace(query=urlencode(rest))), out

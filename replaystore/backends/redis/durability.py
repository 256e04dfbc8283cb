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

__all__ = ["append_and_wait", "appended", "check_options", "options_from"]

#: The append statuses that found their events stored (``append.lua``): a
#: retried append (``dup``) too, since the first try may not have replicated.
_STORED = (b"ok", b"full", b"dup")


def appended(out: Any) -> bool:
    """Whether an append's reply says its events are stored (now or by an earlier try)."""
    return bool(out) and out[1] in _STORED


async def append_and_wait(
    call: Callable[[Callable[[tuple[Any, ...]], Awaitable[Any]]], Awaitable[Any]],
    pipeline: Callable[..., Awaitable[list[Any]]],
    replicas: int,
    wait_s: float,
    stored: Callable[[Any], bool] = appended,
) -> Any:
    """The write ``call`` makes (an append) and ``WAIT`` in one round trip, on one connection.

    ``call`` runs the write through a sender it is given (the script
    library's fallbacks); ``pipeline`` is the wire's; ``stored`` tells from
    the write's reply whether it stored anything that must be durable (an
    append's status; a session opened always does). The reply comes within
    ``wait_s`` plus the socket timeout, whatever the replicas do.
    """
    wait = ("WAIT", replicas, round(wait_s * 1000))

    async def send(command: tuple[Any, ...]) -> Any:
        out, acked = await pipeline([command, wait], slack=wait_s)
        if isinstance(out, Exception):
            raise out
        if isinstance(acked, Exception):
            raise acked
        if stored(out) and int(acked) < replicas:
            raise StorageError(
                f"write stored on the primary but acknowledged by {acked} of "
                f"{replicas} replica(s) within {wait_s:g} s (wait_replicas)",
                kind="unreplicated",
            )
        return out

    return await call(send)


def check_options(wait_replicas: Any, wait_timeout: float, *, cluster: bool) -> None:
    """Refuse durability options that cannot mean what they say."""
    if isinstance(wait_replicas, bool) or not isinstance(wait_replicas, int):
        raise UnsupportedURLError("wait_replicas must be an integer")
    if wait_replicas < 0 or not 0 < wait_timeout <= 3600:
        raise UnsupportedURLError("wait_replicas >= 0 and 0 < wait_timeout <= 3600 seconds")
    if wait_replicas and cluster:
        raise UnsupportedURLError("wait_replicas is not supported on redis+cluster://")


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

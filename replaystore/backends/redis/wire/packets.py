"""Commands in the Redis protocol (RESP), packed once by the caller.

Packing a command costs more client time than Redis spends running a short
one, so callers pack what stays the same once (a script call's head, a
resume's read up to its range) and only the rest per call; these two are
what they pack with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Commands", "pack_args", "pack_one"]

#: Commands built only when a transport sends them through redis-py (a caller
#: that packs them itself gives the packet too).
Commands = Callable[[], Sequence[tuple[Any, ...]]]


def pack_one(command: tuple[Any, ...]) -> bytes:
    """One command in the Redis protocol (RESP)."""
    return b"*%d\r\n" % len(command) + pack_args(command)


def pack_args(args: Sequence[Any]) -> bytes:
    """Arguments in the Redis protocol, without the count that heads a command."""
    out = []
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)

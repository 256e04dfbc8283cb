"""The redis-py versions the Redis backend works with, and what to say when another is installed.

The backend turns maintenance notifications off on its asyncio connections
(see ``_redis_client.py``), an option redis-py's asyncio client has since 8.1.
An older redis-py either fails to import (``redis.maint_notifications`` came
with 7.0) or fails at the first connection with an error about an unknown
keyword argument; neither says that the fix is a newer redis-py. So the
version is checked from the installed package's metadata (this module
imports nothing of redis-py): before a Redis URL's backend is imported, and
when the backend is imported directly.
"""

from __future__ import annotations

import re
from importlib import metadata

__all__ = ["TESTED_REDIS", "explain", "require"]

#: The redis-py range the Redis backend is tested with (also pinned by the
#: ``redis`` extra in the package metadata).
TESTED_REDIS = ">=8.1,<9"
_LOWEST = (8, 1)


def _installed() -> str | None:
    try:
        return metadata.version("redis")
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string (``"8.1.0b1"`` -> ``(8, 1, 0)``)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def _problem() -> str | None:
    installed = _installed()
    if installed is None:
        return "the Redis backend needs redis-py: pip install 'replaystore[redis]'"
    if _release(installed) < _LOWEST:
        return (
            f"the Redis backend needs redis-py {TESTED_REDIS}, but redis-py {installed} "
            f"is installed: pip install 'redis{TESTED_REDIS}'"
        )
    return None


def require() -> None:
    """Raise :class:`ImportError` saying what to install, unless redis-py is recent enough."""
    problem = _problem()
    if problem is not None:
        raise ImportError(problem, name="redis")


def explain(exc: ImportError) -> str:
    """What is wrong when importing the Redis backend raised ``exc``, and what fixes it."""
    problem = _problem()
    if problem is not None:
        return problem
    while isinstance(exc.__cause__, ImportError):  # the import that failed first
        exc = exc.__cause__
    return f"redis-py {_installed()} is installed, but the Redis backend cannot import it: {exc}"

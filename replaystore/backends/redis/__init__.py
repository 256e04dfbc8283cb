"""``redis://``, ``rediss://``, ``redis+unix://``, ``redis+cluster://``, ``redis+sentinel://``.

The layout is drawn in ``docs/data-layout.md``: one list of events per
sequence, a run index that maps positions to sequences, and a meta hash with
the bookkeeping. Every key of a session carries the session's hash tag (one
Redis Cluster slot), and every key a script touches is declared in ``KEYS``.

How a call reaches Redis:

* a resume whose cursor carries a hint reads the meta hash and a native
  ``LRANGE`` of the sequence's list in one pipelined round trip (no Lua, no
  ``MULTI``: see ``fastpath.py`` for why none is needed) and judges them in Python;
  only a read in doubt goes further;
* otherwise ``facts.lua`` gathers the facts in one script, the verdict is
  decided in Python (``replaystore/rules.py``, the same rules as in memory);
  a failure the facts leave no doubt about (malformed, foreign, ahead,
  evicted, mismatch) is torn down by that same script, on the state it read,
  and any other failed resume by ``close.lua`` as a compare-and-delete on the
  state the verdict was decided on (judged again if the session moved);
* an append is one ``append_lean.lua`` (one event, nothing else due) or one
  ``append.lua`` (a whole batch, anything due), and both where the lean one
  finds more due; sweeps of evicted elements and lazy TTL refreshes follow as
  separate scripts only when due.

The operations run as one Redis function library (``FCALL``, loaded on first
use) on clients that talk to one server, and as scripts (EVALSHA, re-sent with
EVAL on NOSCRIPT) on a cluster, on fakes, on a read-only replica and where an
ACL refuses functions (``scripts.py``). URL forms (query
``prefix=`` sets the key prefix, default ``replaystore:``)::

    redis://[[user]:password@]host[:port][/db][?prefix=app1:]
    rediss://...                                  (TLS; ssl_* query options as in redis-py)
    redis+unix:///path/to/redis.sock[?db=0]
    redis+cluster://[[user]:password@]host:port[,host:port...][?prefix=...]
    rediss+cluster://...                          (TLS)
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]

``wait_replicas=N`` (and ``wait_timeout=SECONDS``, default 1), in the query or
as ``from_url`` options, makes every append wait until ``N`` replicas
acknowledged it (Redis ``WAIT``, sent with the append on the same connection);
an append that is not acknowledged in time raises :class:`StorageError`
(standalone and Sentinel deployments).

``from_url(..., client=...)`` takes a ready ``redis.asyncio`` client instead
(fakeredis in tests, or a client the application already configured); it must
not decode responses.

The package by idea: ``backend.py`` (the five operations), ``wire/`` (how
commands reach Redis: one protocol, a transport chosen per client),
``redispy.py`` (the redis-py names the direct transport relies on),
``scripts.py`` (the Lua library, ``lua/*.lua``, and how a server runs it),
``replies.py`` (reply decoding), ``fastpath.py`` (the resume fast path),
``client.py`` (clients from URLs: how to reach Redis), ``keys.py`` (every key
and channel name, of every part).

Importing the package first checks the installed redis-py (below), before
anything of it is imported. The backend turns maintenance notifications off
on its asyncio connections (``client.py``), an option redis-py's asyncio
client has since 8.1. An older redis-py either fails to import
(``redis.maint_notifications`` came with 7.0) or fails at the first
connection with an error about an unknown keyword argument; neither says that
the fix is a newer redis-py. So the version is read from the installed
package's metadata, and a failed import says what to install.
"""

from __future__ import annotations

import re
from importlib import metadata

__all__ = ["DEFAULT_PREFIX", "TESTED_REDIS", "RedisBackend"]

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


# First: an older redis-py may import fine and fail only at the first connection.
require()
try:
    from .backend import DEFAULT_PREFIX, RedisBackend
except ImportError as exc:
    raise ImportError(explain(exc), name="redis") from exc

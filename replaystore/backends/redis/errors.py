"""What the Redis backend's foreign errors mean: one table, one way to make them ``StorageError``.

redis-py, its cluster client and the sockets under them raise their own
exceptions. Those that are the store's (no answer, a lost connection, an
error reply) become :class:`~replaystore.errors.StorageError` through
:data:`TABLE`, at the one call of each operation that talks to Redis
(:func:`mapped`, :func:`storage_error_for`); the HTTP layer answers them
with 503 and ``Retry-After``. Every other exception (an ``AttributeError``,
a ``TypeError``, redis-py's ``DataError`` for an argument it cannot send) is
a bug: it is not in the table, so it propagates as it is, and the client
gets a 500 with the traceback in the log instead of a store said to be
unreachable.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Iterator
from typing import Any

from redis.exceptions import (
    BusyLoadingError,
    ClusterError,
    InvalidResponse,
    MasterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...errors import StorageError

__all__ = [
    "FOREIGN",
    "STORE_ERRORS",
    "TABLE",
    "mapped",
    "note_policy",
    "refusal",
    "storage_error",
    "storage_error_for",
]

#: Each foreign exception class that is the store's, by what it says: a
#: refusal's code (a key of :data:`_REFUSALS`), ``"ERR"`` for any other error
#: reply (its code, if any, is still in its text: a script's error, a reply
#: read by hand), or ``"unreachable"`` (no answer in time, a refused or lost
#: connection, a reply that is not Redis' protocol, no node of a cluster to
#: ask). Checked in order, first match wins: a subclass comes before its base.
#: An exception of no class here is not the store's.
TABLE: dict[type[BaseException], str] = {
    # Error replies whose code redis-py took off the text, naming the class by it.
    OutOfMemoryError: "OOM",
    ReadOnlyError: "READONLY",
    NoPermissionError: "NOPERM",
    BusyLoadingError: "LOADING",  # a ConnectionError for redis-py: checked first
    MasterDownError: "MASTERDOWN",
    # Any other error reply (CLUSTERDOWN, a script's error, ...).
    ResponseError: "ERR",
    # No answer.
    RedisConnectionError: "unreachable",  # with AuthenticationError, MaxConnectionsError, ...
    RedisTimeoutError: "unreachable",
    InvalidResponse: "unreachable",
    ClusterError: "unreachable",  # redirected too often
    RedisClusterException: "unreachable",  # no reachable node, slot not covered
    OSError: "unreachable",  # a socket error redis-py let through; TimeoutError too
}

#: The classes of :data:`TABLE`: what :func:`mapped` turns into ``StorageError``.
FOREIGN: tuple[type[BaseException], ...] = tuple(TABLE)

#: Every exception that is the store's, made a ``StorageError`` already or not
#: yet: for an ``except`` clause that handles the store's errors its own way
#: (a loop that waits for the store, a hint that may be lost).
STORE_ERRORS: tuple[type[BaseException], ...] = (StorageError, *FOREIGN)

#: Error codes Redis answers when it refuses a command, by the kind of
#: :class:`StorageError` they become, with what the code means.
_REFUSALS: dict[str, tuple[str, str]] = {
    "OOM": ("oom", "redis is out of memory (maxmemory reached{policy}): writes refused"),
    "READONLY": ("readonly", "redis is a read-only replica: writes refused"),
    "NOPERM": ("noperm", "redis forbids it (ACL)"),
    "MISCONF": ("misconf", "redis refuses writes: it cannot persist (MISCONF)"),
    "LOADING": ("loading", "redis is loading its data set"),
    "BUSY": ("busy", "redis is busy running a script"),
    "MASTERDOWN": ("readonly", "redis is a replica without its primary"),
}
#: An error inside a script: Redis 7 names it ``ERR ... script: ...`` with the
#: code of the command that failed kept in the text.
_CODE = re.compile(r"(?:^|: )(OOM|READONLY|NOPERM|MISCONF|LOADING|BUSY|MASTERDOWN)\b")
#: An ACL refusal of a command run from a script (Redis 7.0 words it so).
_SCRIPT_ACL = re.compile(r"user executing the script can't run this command", re.IGNORECASE)


def _entry(exc: BaseException) -> str | None:
    """What :data:`TABLE` says of ``exc``, or None when it is not the store's."""
    return next((said for cls, said in TABLE.items() if isinstance(exc, cls)), None)


def storage_error_for(exc: BaseException, what: str, client: Any = None) -> StorageError | None:
    """The :class:`StorageError` ``exc`` means when ``what`` raised it, or None if not the store's.

    Says what Redis said when it refused (out of memory, with the eviction
    policy ``client``'s Redis last reported; read-only; the command or key
    its ACL forbids), "unreachable" for a connection that failed or an
    answer that did not come, and passes an existing :class:`StorageError`
    through. Anything :data:`TABLE` does not list gives None: the caller
    lets it propagate as the bug it is.
    """
    if isinstance(exc, StorageError):
        return exc
    said = _entry(exc)
    if said is None:
        return None
    policy = None
    if client is not None:
        with contextlib.suppress(TypeError):
            policy = _POLICIES.get(client)
    refused = refusal(exc, policy=policy)
    if refused is not None:
        kind, meaning, permanent = refused
        text = f"{what} refused: {meaning}: {_strip(str(exc))}"
        return StorageError(text, kind=kind, permanent=permanent)
    if said == "ERR":
        # Redis answered: it refused this command; the server is reachable.
        return StorageError(f"{what} refused by redis: {exc}", kind="error")
    return StorageError(f"{what} failed on redis: {exc}")


def storage_error(what: str, exc: BaseException, client: Any = None) -> StorageError:
    """:func:`storage_error_for` of an error the store answered (a pipeline's error reply).

    An exception that is not the store's is raised again from here: it
    stays the bug it is.
    """
    error = storage_error_for(exc, what, client)
    if error is None:
        raise exc
    return error


@contextlib.contextmanager
def mapped(what: str, client: Any = None) -> Iterator[None]:
    """Raise the store's errors of the block as :class:`StorageError`; anything else as it is.

    The boundary of one operation that talks to Redis: ``what`` names it in
    the message (``"session registry read"``), ``client`` is the one whose
    eviction policy an out-of-memory refusal names.
    """
    try:
        yield
    except FOREIGN as exc:
        raise storage_error(what, exc, client) from exc


def refusal(exc: BaseException, *, policy: str | None = None) -> tuple[str, str, bool] | None:
    """``(kind, what it means, permanent)`` when ``exc`` is Redis refusing a command, else None.

    A refusal (out of memory, read-only, ACL, ...) is an answer from a
    reachable server; only an ACL refusal is permanent. ``policy``: the
    server's ``maxmemory-policy`` if known, named by an out-of-memory refusal.
    """
    said = _entry(exc)
    code = said if said in _REFUSALS else None
    if code is None and said == "ERR":
        text = str(exc)
        found = _CODE.search(text)
        if found is not None:
            code = found.group(1)
        elif _SCRIPT_ACL.search(text):
            code = "NOPERM"
    if code is None:
        return None
    kind, meaning = _REFUSALS[code]
    meaning = meaning.replace("{policy}", _out_of_memory(policy) if code == "OOM" else "")
    if code == "NOPERM" and _SCRIPT_ACL.search(str(exc)):
        command = _function_command(str(exc))
        named = f"the {command!r} command" if command else "a command"
        meaning += f": {named}, run by a replaystore function, is not permitted to this user"
    return kind, meaning, kind == "noperm"


#: The ``maxmemory-policy`` each client's Redis reported when last asked (at start-up and
#: by each store check): what an out-of-memory refusal names.
_POLICIES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def note_policy(client: Any, policy: str) -> None:
    """Remember the ``maxmemory-policy`` that ``client``'s Redis reported."""
    with contextlib.suppress(TypeError):  # a client that cannot be weakly referenced
        _POLICIES[client] = policy


def _out_of_memory(policy: str | None) -> str:
    """Why Redis refused a write for memory, in the words of its policy."""
    if policy is None:
        return "; its maxmemory-policy, not read yet, freed too little"
    if policy == "noeviction":
        return " with noeviction"
    return f"; its maxmemory-policy {policy} freed too little"


def _strip(text: str) -> str:
    """Redis' reply text without the script's hash, which says nothing to an operator."""
    return re.sub(r"\s*script: [0-9a-f]{40},?", "", text).strip()


def _function_command(text: str) -> str | None:
    """The command on the line of replaystore's function library that Redis' error points at."""
    found = re.search(r"@user_function:(\d+)", text)
    if found is None:
        return None
    from .scripts import LIBRARY

    lines = LIBRARY.splitlines()
    number = int(found.group(1))
    if not 0 < number <= len(lines):
        return None
    call = re.search(r"redis\.p?call\('([A-Za-z]+)'", lines[number - 1])
    return call.group(1) if call else None

"""The Redis backend's table of foreign errors: each listed class, its kind; the rest pass.

Every class of ``redis.exceptions`` is either in the table (its exceptions are
the store's: ``StorageError`` of some kind, answered 503) or named here as not
the store's (a bug or a control-flow signal, which must propagate as it is and
be answered 500): a redis-py release that adds a class fails here until it is
placed.
"""

from __future__ import annotations

import inspect

import pytest
import redis.asyncio.sentinel
import redis.exceptions as rx

from replaystore.backends.redis.errors import (
    FOREIGN,
    STORE_ERRORS,
    TABLE,
    mapped,
    storage_error,
    storage_error_for,
)
from replaystore.errors import StorageError

#: An exception of each class the table lists (and a few subclasses), the kind
#: it becomes and whether it is permanent.
CASES: list[tuple[BaseException, str, bool]] = [
    (rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "oom", False),
    (rx.ReadOnlyError("You can't write against a read only replica."), "readonly", False),
    (rx.NoPermissionError("this user has no permissions to run the 'set' command"), "noperm", True),
    (rx.BusyLoadingError("Redis is loading the dataset in memory"), "loading", False),
    (rx.MasterDownError("Link with MASTER is down"), "readonly", False),
    (rx.ResponseError("MISCONF Redis is configured to save RDB snapshots"), "misconf", False),
    (rx.ResponseError("BUSY Redis is busy running a script."), "busy", False),
    (rx.ResponseError("ERR Error running script: OOM command not allowed"), "oom", False),
    (rx.ResponseError("ERR user executing the script can't run this command"), "noperm", True),
    (rx.ResponseError("ERR unknown command 'FCALL'"), "error", False),
    (rx.ClusterDownError("The cluster is down"), "error", False),
    (rx.ClusterCrossSlotError("Keys in request don't hash to the same slot"), "error", False),
    (
        rx.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
        "unreachable",
        False,
    ),
    (rx.AuthenticationError("invalid password"), "unreachable", False),
    (rx.MaxConnectionsError("Too many connections"), "unreachable", False),
    (redis.asyncio.sentinel.MasterNotFoundError("No master found for 'x'"), "unreachable", False),
    (rx.TimeoutError("Timeout reading from socket"), "unreachable", False),
    (rx.InvalidResponse("Protocol Error: b'?'"), "unreachable", False),
    (rx.ClusterError("TTL exhausted."), "unreachable", False),
    (rx.RedisClusterException("Redis Cluster cannot be connected"), "unreachable", False),
    (rx.SlotNotCoveredError("slot 12 is not covered"), "unreachable", False),
    (OSError(113, "No route to host"), "unreachable", False),
    (ConnectionRefusedError(111, "Connection refused"), "unreachable", False),
    (TimeoutError(), "unreachable", False),
]

#: Exceptions that are not the store's: a bug of replaystore's or of a caller
#: (redis-py's DataError: an argument it cannot send; a client set up wrong),
#: or a signal a caller handles (WatchError: an optimistic transaction lost
#: its race).
NOT_THE_STORE: list[BaseException] = [
    AttributeError("'Redis' object has no attribute 'evalsha_ro'"),
    TypeError("unsupported operand"),
    KeyError("x"),
    ValueError("invalid literal for int()"),
    RuntimeError("pubsub connection not set"),
    rx.DataError("Invalid input of type: 'NoneType'"),
    rx.PubSubError("Channel: 'x' has no handler registered"),
    rx.WatchError("Watched variable changed."),
    rx.LockError("Cannot release an unlocked lock"),
    rx.LockNotOwnedError("Cannot release a lock that's no longer owned"),
    rx.ChildDeadlockedError(),
    rx.IncorrectPolicyType("Incorrect request policy type"),
    # Raised bare for a client set up wrong (an SSL flag, a parser), or misused
    # (nested MULTI): not an answer of the server's.
    rx.RedisError("Cannot issue nested calls to MULTI"),
]


@pytest.mark.parametrize(("exc", "kind", "permanent"), CASES, ids=lambda v: repr(v)[:60])
def test_each_store_error_becomes_its_kind(exc: BaseException, kind: str, permanent: bool) -> None:
    error = storage_error_for(exc, "an append")
    assert isinstance(error, StorageError)
    assert (error.kind, error.permanent) == (kind, permanent)
    assert error.args[0].startswith("an append ")


def test_every_class_of_the_table_has_a_case() -> None:
    tested = {type(exc) for exc, _, _ in CASES}
    assert set(TABLE) <= tested, set(TABLE) - tested
    assert set(FOREIGN) == set(TABLE)
    assert set(STORE_ERRORS) == {StorageError, *TABLE}


@pytest.mark.parametrize("exc", NOT_THE_STORE, ids=lambda v: type(v).__name__)
def test_what_is_not_the_store_is_not_mapped(exc: BaseException) -> None:
    assert storage_error_for(exc, "an append") is None
    with pytest.raises(type(exc)) as raised:
        storage_error("an append", exc)
    assert raised.value is exc


def test_every_redis_py_class_is_placed() -> None:
    """A class redis-py adds must be put in the table or named as not the store's."""
    placed = {type(exc) for exc in NOT_THE_STORE}
    unplaced = [
        cls.__name__
        for _, cls in inspect.getmembers(rx, inspect.isclass)
        if issubclass(cls, BaseException)
        and cls.__module__ == rx.__name__
        and cls not in placed
        and not issubclass(cls, FOREIGN)
    ]
    assert not unplaced, unplaced


def test_a_storage_error_passes_through_as_it_is() -> None:
    error = StorageError("the task store did not answer", kind="error")
    assert storage_error_for(error, "an append") is error


def test_an_out_of_memory_refusal_names_the_policy_of_its_client() -> None:
    from replaystore.backends.redis.errors import note_policy

    class Client:  # any object that can be weakly referenced stands for a client
        pass

    client = Client()
    note_policy(client, "allkeys-lru")
    error = storage_error_for(rx.OutOfMemoryError("command not allowed"), "an append", client)
    assert error is not None and "allkeys-lru freed too little" in str(error)


def test_mapped_raises_the_store_error_from_its_cause() -> None:
    cause = rx.ConnectionError("Connection reset by peer")
    with pytest.raises(StorageError) as raised, mapped("session registry read"):
        raise cause
    assert raised.value.kind == "unreachable"
    assert raised.value.__cause__ is cause
    assert str(raised.value) == "session registry read failed on redis: Connection reset by peer"


@pytest.mark.parametrize("exc", NOT_THE_STORE, ids=lambda v: type(v).__name__)
def test_mapped_lets_a_bug_through_untouched(exc: BaseException) -> None:
    with pytest.raises(type(exc)) as raised, mapped("session registry read"):
        raise exc
    assert raised.value is exc


def test_mapped_lets_a_storage_error_through_untouched() -> None:
    error = StorageError("refused", kind="oom")
    with pytest.raises(StorageError) as raised, mapped("task get"):
        raise error
    assert raised.value is error

"""The task record: what every replica reads and writes, and its compact stored form.

A task's result, error and input requests are JSON objects chosen by the tool
or the client; they are stored as msgpack (smaller than JSON and cheap to
decode), each one a separate blob so a poll that only needs the status never
decodes a large result. The wire shape (the spec's ``DetailedTask``) is built
from the record by :meth:`TaskRecord.detailed`, in one place, so ``tasks/get``,
the ``CreateTaskResult`` and status notifications can never disagree.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import msgpack

from ..errors import ReplayStoreError, StorageError

__all__ = [
    "ACTIVE",
    "CANCELLED",
    "COMPLETED",
    "FAILED",
    "INPUT_REQUIRED",
    "LOST_ERROR",
    "MAX_BLOB",
    "OUTAGE_ERROR",
    "RESTORED_ERROR",
    "TERMINAL",
    "WORKING",
    "Beat",
    "NotReplicatedError",
    "Reaped",
    "TaskInputError",
    "TaskRecord",
    "new_task_id",
    "pack",
    "unpack",
    "valid_task_id",
]

WORKING: Final = "working"
INPUT_REQUIRED: Final = "input_required"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"

ACTIVE: Final = frozenset({WORKING, INPUT_REQUIRED})
TERMINAL: Final = frozenset({COMPLETED, FAILED, CANCELLED})

#: The largest stored blob (a result, an error, one input request or response).
#: A bigger one is refused before anything is written, so a client cannot fill
#: the store through ``tasks/update`` and a tool's oversized result fails its
#: task with an error instead of half-writing it.
MAX_BLOB: Final = 1 << 20

#: The JSON-RPC error of a task whose runner stopped (killed, partitioned,
#: out of memory) before it finished: the task ends ``failed`` with it once the
#: runner's lease lapses, on whichever replica looks first.
LOST_ERROR: Final[dict[str, Any]] = {
    "code": -32603,
    "message": "the server running this task stopped before it finished",
}

#: The JSON-RPC error of a task whose lease lapsed while the store answered no
#: one (a lapse no replica could see for a whole lease after it happened), and
#: whose runner did not renew it in the lease that followed: the runner may
#: live on, cut off from the store, or have stopped during the outage.
OUTAGE_ERROR: Final[dict[str, Any]] = {
    "code": -32603,
    "message": "the task store could not be reached for longer than the task's lease, "
    "and the server running this task did not renew it once the store answered again",
}

#: The JSON-RPC error of a task the store holds from before it went back in
#: time (restored from an older snapshot, failed over to a replica that had not
#: received every write) and that reads as unfinished: its client may have seen
#: it end since, so it ends ``failed`` with this, and its tool never runs again.
RESTORED_ERROR: Final[dict[str, Any]] = {
    "code": -32603,
    "message": "store_regressed: the task store went back in time since this task began "
    "(restored from an older snapshot, or failed over to a replica that had not received "
    "every write); its record cannot be trusted, so the task ended without running again",
}

# 24 URL-safe characters: 144 random bits.
_ID_BYTES: Final = 18
_ID_SHAPE: Final = re.compile(r"[A-Za-z0-9_-]{24}")


class TaskInputError(ReplayStoreError, ValueError):
    """A value cannot be stored in a task (too large, or not JSON-shaped)."""


class NotReplicatedError(StorageError):
    """A change is stored on the primary but fewer replicas than required acknowledged it.

    Raised with ``wait_replicas`` for a client's change (``tasks/update``,
    ``tasks/cancel``): the change stands on the primary, but a failover now
    could lose it, so the client is told to repeat it (both are safe to repeat).
    """


def new_task_id() -> str:
    """A fresh task id: 144 random bits, URL-safe, never containing a hash-tag brace."""
    return secrets.token_urlsafe(_ID_BYTES)


def valid_task_id(value: object) -> bool:
    """Whether ``value`` has the shape of an id :func:`new_task_id` makes.

    Checked before any store access, so a malformed id costs no round trip and
    never reaches a key name.
    """
    return isinstance(value, str) and _ID_SHAPE.fullmatch(value) is not None


def pack(value: Mapping[str, Any]) -> bytes:
    """The stored form of a JSON object; :class:`TaskInputError` if it cannot be stored."""
    try:
        blob: bytes = msgpack.packb(value, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TaskInputError(f"not a JSON value: {exc}") from exc
    if len(blob) > MAX_BLOB:
        raise TaskInputError(f"{len(blob)} bytes, more than the {MAX_BLOB} a task stores")
    return blob


def unpack(blob: bytes) -> dict[str, Any]:
    """A JSON object from its stored form."""
    value = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    if not isinstance(value, dict):
        raise TaskInputError("a stored task value is not an object")
    return value


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task as the store holds it. Times are milliseconds since the epoch, store clock.

    ``input_requests`` holds the outstanding requests only: an answered one
    leaves it in the same atomic step that records the answer. ``rerun`` (not
    on the wire): the runner's lease lapsed on a re-runnable task, so a replica
    may :meth:`~.store.TaskStore.claim` it and run it again.
    """

    task_id: str
    status: str
    created_ms: int
    updated_ms: int
    ttl_ms: int
    poll_ms: int | None = None
    message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    rerun: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def detailed(self) -> dict[str, Any]:
        """The spec's ``DetailedTask``: the task with its status's payload inlined."""
        task: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": _iso(self.created_ms),
            "lastUpdatedAt": _iso(self.updated_ms),
            "ttlMs": self.ttl_ms,
        }
        if self.poll_ms is not None:
            task["pollIntervalMs"] = self.poll_ms
        if self.message is not None:
            task["statusMessage"] = self.message
        if self.status == COMPLETED and self.result is not None:
            task["result"] = self.result
        elif self.status == FAILED and self.error is not None:
            task["error"] = self.error
        elif self.status == INPUT_REQUIRED:
            task["inputRequests"] = dict(self.input_requests)
        return task


@dataclass(frozen=True, slots=True)
class Beat:
    """What the runner learns when it renews its lease.

    ``status`` is the task's status (a terminal one tells the runner to stop:
    the task was cancelled, or failed as lost while the runner was stalled);
    ``answers`` are input responses recorded since the last beat, handed over
    once.
    """

    status: str
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reaped:
    """What one background scan of the store's running tasks found.

    ``failed``: tasks this scan ended ``failed`` because their runner's lease
    lapsed (whoever applies the lapse rule first reports it; a task appears
    here on one replica only). ``orphaned``: re-runnable tasks whose runner's
    lease lapsed, for the scanner to :meth:`~.store.TaskStore.claim` (one
    claimant wins). ``next_in``: seconds until the next lease may lapse, as far
    as the store knows (0: more tasks are due now; None: no task is running).
    """

    failed: list[str] = field(default_factory=list)
    orphaned: list[str] = field(default_factory=list)
    next_in: float | None = None

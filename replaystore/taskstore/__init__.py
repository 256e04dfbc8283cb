"""Durable MCP tasks (the ``io.modelcontextprotocol/tasks`` extension), shared by every replica.

:class:`TaskStore` is the contract, :func:`task_store_for` builds the store a
backend's replica coordination declares (memory or Redis); the MCP glue is
:mod:`replaystore.mcp.tasks.extension`. See ``docs/tasks.md``.
"""

from __future__ import annotations

from ..backends.coordination import Coordination, OnRedis
from .memory import MemoryTaskStore
from .records import (
    CANCELLED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    LOST_ERROR,
    OUTAGE_ERROR,
    TERMINAL,
    WORKING,
    Beat,
    NotReplicatedError,
    TaskInputError,
    TaskRecord,
    new_task_id,
    valid_task_id,
)
from .store import TaskStore

__all__ = [
    "CANCELLED",
    "COMPLETED",
    "FAILED",
    "INPUT_REQUIRED",
    "LOST_ERROR",
    "OUTAGE_ERROR",
    "TERMINAL",
    "WORKING",
    "Beat",
    "MemoryTaskStore",
    "NotReplicatedError",
    "TaskInputError",
    "TaskRecord",
    "TaskStore",
    "new_task_id",
    "task_store_for",
    "valid_task_id",
]


def task_store_for(
    coordination: Coordination,
    *,
    namespace: str = "",
    wait_replicas: int = 0,
    wait_timeout: float = 1.0,
) -> TaskStore:
    """The task store a backend's coordination declares: beside the sessions, in its store.

    ``namespace``: whose tasks these are (the app serving them). Stores of
    different namespaces on one backend share nothing: no task of one can be
    read, claimed or ended through the other.

    ``wait_replicas`` (Redis): a create, and every later change of a task's
    status, returns only once that many replicas acknowledged it, within
    ``wait_timeout`` seconds (see :class:`~.redis.RedisTaskStore`).
    """
    if isinstance(coordination, OnRedis):
        from .redis import RedisTaskStore

        return RedisTaskStore(
            coordination,
            namespace=namespace,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
        )
    return MemoryTaskStore(coordination.scope, namespace=namespace)

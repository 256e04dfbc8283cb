"""Durable MCP tasks (the ``io.modelcontextprotocol/tasks`` extension), shared by every replica.

:class:`TaskStore` is the contract and :mod:`.records` what it stores; each
backend's replica coordination builds its own store
(:meth:`~replaystore.backends.coordination.Coordination.task_store`: the
memory one in :mod:`replaystore.backends.memory.tasks`, the Redis one in
:mod:`replaystore.backends.redis.coordination.tasks`). The MCP glue is
:mod:`replaystore.mcp.tasks.extension`. Public: a third-party backend that
serves MCP replicas builds a :class:`TaskStore` of its own. See ``docs/tasks.md``.
"""

from __future__ import annotations

from .events import EventPage, EventRetention, TaskEvent, TaskEventError
from .records import (
    CANCELLED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    LOST_ERROR,
    OUTAGE_ERROR,
    RESTORED_ERROR,
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
    "RESTORED_ERROR",
    "TERMINAL",
    "WORKING",
    "Beat",
    "EventPage",
    "EventRetention",
    "NotReplicatedError",
    "TaskEvent",
    "TaskEventError",
    "TaskInputError",
    "TaskRecord",
    "TaskStore",
    "new_task_id",
    "valid_task_id",
]

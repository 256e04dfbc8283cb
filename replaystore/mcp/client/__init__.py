"""Client side: resuming sessions, events delivered once, and tools called as durable tasks.

- :class:`ResumingSession` (and :func:`raise_for_desync`,
  :class:`DesyncWatch`, :func:`desync_error` underneath): a failed
  resumption's verdict as a :class:`~replaystore.ResumptionDesyncError`,
  then a new session;
- :class:`OncePerStream`: an ``httpx2`` transport that hands each event of a
  stream to the application once;
- :class:`TaskClient` (2026-07-28): a tool called as a durable task, polled,
  answered and picked up again after a restart, and its events
  (:meth:`TaskClient.stream_events`, :class:`TaskEventStream`) each once, in
  order, across reconnects; :class:`ClientTasks`, the
  same as a client extension of the SDK's or FastMCP's ``Client``.

See ``docs/mcp.md`` and ``docs/tasks.md``.
"""

from __future__ import annotations

from .extension import ClientTasks, CreatedTask
from .once import OncePerStream
from .resuming import DesyncWatch, ResumingSession, desync_error, raise_for_desync
from .task_events import EventsGoneError, TaskEvent, TaskEventStream, TaskStreamError
from .tasks import (
    OnCreatedError,
    TaskCancelledError,
    TaskClient,
    TaskError,
    TaskFailedError,
    TaskRequestError,
    TaskUnavailableError,
)

__all__ = [
    "ClientTasks",
    "CreatedTask",
    "DesyncWatch",
    "EventsGoneError",
    "OnCreatedError",
    "OncePerStream",
    "ResumingSession",
    "TaskCancelledError",
    "TaskClient",
    "TaskError",
    "TaskEvent",
    "TaskEventStream",
    "TaskFailedError",
    "TaskRequestError",
    "TaskStreamError",
    "TaskUnavailableError",
    "desync_error",
    "raise_for_desync",
]

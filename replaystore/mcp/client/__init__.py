"""Client side: resuming sessions, events delivered once, and tools called as durable tasks.

- :class:`DesyncWatch`: the one way a client learns why the server ended
  its session, a hook on its HTTP client that turns each 404 into a
  :class:`~replaystore.ResumptionDesyncError` carrying the verdict;
  :class:`ResumingSession`, the SDK's client session with that watch built
  in, raises it and opens a new session;
- :class:`OncePerStream`: an ``httpx2`` transport that hands each event of a
  stream to the application once;
- :class:`RetryUnavailable`: an ``httpx2`` transport that sends a request
  answered 503 with ``Retry-After`` again, within a :class:`RetryBudget`
  (on by default in ``DesyncWatch.client_factory`` and ``ResumingSession``);
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
from .resuming import DesyncWatch, ResumingSession
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
from .unavailable import RetryBudget, RetryUnavailable

__all__ = [
    "ClientTasks",
    "CreatedTask",
    "DesyncWatch",
    "EventsGoneError",
    "OnCreatedError",
    "OncePerStream",
    "ResumingSession",
    "RetryBudget",
    "RetryUnavailable",
    "TaskCancelledError",
    "TaskClient",
    "TaskError",
    "TaskEvent",
    "TaskEventStream",
    "TaskFailedError",
    "TaskRequestError",
    "TaskStreamError",
    "TaskUnavailableError",
]

"""Durable tasks (2026-07-28, the ``io.modelcontextprotocol/tasks`` extension) for the official SDK.

Give a :class:`ReplayTasks` to the server and to the app::

    from replaystore.mcp import streamable_http_app
    from replaystore.mcp.tasks import ReplayTasks, TaskSupport

    tasks = ReplayTasks({"report": "optional", "migrate": TaskSupport("required")})
    mcp = MCPServer("demo", extensions=[tasks])
    app = streamable_http_app(mcp, buffer, tasks=tasks)

A task's tool emits events any replica streams (``tasks/stream``) with
:func:`emit_event`; :class:`EventRetention` says how long they are kept.

Loaded only by servers that serve tasks: a 2025-11-25 server never imports
this package nor the task store (:mod:`replaystore.taskstore`). See
``docs/tasks.md``.
"""

from __future__ import annotations

from ...taskstore.events import EventRetention, TaskEventError
from .events import emit_event
from .extension import EXTENSION, ReplayTasks, TaskSession, TaskSupport

__all__ = [
    "EXTENSION",
    "EventRetention",
    "ReplayTasks",
    "TaskEventError",
    "TaskSession",
    "TaskSupport",
    "emit_event",
]

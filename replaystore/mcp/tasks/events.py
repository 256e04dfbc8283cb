"""What a task's tool calls to emit a task event: :func:`emit_event`.

Works the same for an ``MCPServer`` tool and a FastMCP tool: both hand the
tool a ``Context`` whose session, inside a task, is the task's
:class:`~replaystore.mcp.tasks.TaskSession`. The event is stored with the
task (any replica streams it, ``tasks/stream``) before this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .session import TaskSession

__all__ = ["emit_event"]


def _session(ctx: Any) -> Any:
    """The session behind a tool's context (SDK or FastMCP ``Context``, or a request context)."""
    request = getattr(ctx, "request_context", None)
    if request is not None and getattr(request, "session", None) is not None:
        return request.session
    try:
        return getattr(ctx, "session", None)
    except (RuntimeError, ValueError, AttributeError):  # a context outside a request
        return None


async def emit_event(ctx: Any, type: str, payload: Mapping[str, Any]) -> int | None:
    """Store an event of the task this tool runs as; its ``seq``, or None outside a task.

    ``type`` must carry a vendor prefix (``"com.example/step"``; see
    :func:`~replaystore.taskstore.sep2694.type_problem`), ``payload`` is a JSON
    object: otherwise :class:`~replaystore.taskstore.TaskEventError`, and
    nothing is stored. A plain call of a tool that may also run as a task has
    no event stream: nothing is stored and None is returned. A store that
    stalls or cannot be reached is waited for while the run holds its task;
    a refusal waiting cannot cure (an ACL) raises
    :class:`~replaystore.errors.StorageError`. When
    this run no longer holds its task (the task was cancelled or ended, or
    another replica runs it again), nothing is stored and the run is stopped.
    """
    session = _session(ctx)
    if not isinstance(session, TaskSession):
        return None
    return await session.emit_event(type, payload)

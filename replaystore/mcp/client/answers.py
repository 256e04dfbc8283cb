"""What the answer to a request of a :class:`~replaystore.mcp.client.TaskClient` means.

The errors a request ends with, and how a failure is told apart: a "not
now" (a ``503``, a balancer's error page, a store outage answered 200) is
sent again, anything else the server meant ends the request. Shared by the
task calls and the task event streams, which retry alike.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ...errors import ReplayStoreError

__all__ = [
    "RETRY_STATUSES",
    "TaskError",
    "TaskRequestError",
    "TaskUnavailableError",
    "response_message",
    "retry_after",
    "transient",
]


class TaskError(ReplayStoreError):
    """A task did not produce a result."""


class TaskRequestError(TaskError):
    """The server answered a request with a JSON-RPC error (e.g. -32602 for an unknown task)."""

    def __init__(self, method: str, error: Mapping[str, Any]) -> None:
        self.code = error.get("code")
        self.error = dict(error)
        super().__init__(f"{method}: {error.get('message')} ({self.code})")


class TaskUnavailableError(TaskRequestError):
    """The server (or the way to it) kept failing the request for ``retry_for`` seconds.

    ``error`` is the last failure: the JSON-RPC error, or the HTTP status
    (``code``) or the connection error (``code`` None) as a message.
    """


#: HTTP statuses of a "not now": a replica or a balancer that may serve the request later.
RETRY_STATUSES = frozenset({408, 413, 429, 500, 502, 503, 504})
#: The -32603 message of servers that answer a store outage with HTTP 200.
_STORE_UNREACHABLE = "the task store is unreachable"


def transient(error: Mapping[str, Any], status: int) -> bool:
    """Whether a JSON-RPC error says "not now" rather than "no".

    A 503 (the store did not serve it, or the replica is draining) and the
    -32603 of a store outage answered 200 by servers that do not say 503.
    """
    if status in (502, 503, 504):
        return True
    data = error.get("data")
    if isinstance(data, Mapping) and data.get("reason") == "storage_error":
        return True
    return error.get("code") == -32603 and _STORE_UNREACHABLE in str(error.get("message"))


def retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (a number; a date is ignored)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


def response_message(text: str, content_type: str, request_id: str) -> dict[str, Any] | None:
    """The JSON-RPC response to ``request_id`` in a JSON or SSE body."""
    candidates: list[str] = []
    if "text/event-stream" in content_type:
        for line in text.splitlines():
            if line.startswith("data:"):
                candidates.append(line[5:].strip())
    else:
        candidates.append(text)
    for candidate in candidates:
        try:
            message = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("id") == request_id:
            return message
    return None

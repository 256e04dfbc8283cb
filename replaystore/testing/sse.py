"""A minimal SSE reader for tests and benchmarks that talk to MCP servers over raw HTTP.

Only what MCP servers send (``id``, ``data``, ``retry``; comments skipped), so
that a test sees exactly the events on the wire, with no client library
reconnecting or deduplicating behind its back.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["SSE", "sse_events"]


class _Lines(Protocol):
    def aiter_lines(self) -> AsyncIterator[str]: ...


@dataclass
class SSE:
    """One event: ``data`` is empty for a priming event."""

    id: str | None
    data: str
    retry: int | None = None

    @property
    def message(self) -> dict[str, Any] | None:
        return json.loads(self.data) if self.data else None

    @property
    def priming(self) -> bool:
        return not self.data


async def sse_events(response: _Lines) -> AsyncIterator[SSE]:
    """The events of an SSE body (an ``httpx.Response`` opened with ``stream``)."""
    event_id: str | None = None
    data: list[str] = []
    retry: int | None = None
    seen = False
    async for line in response.aiter_lines():
        if line == "":
            if seen:
                yield SSE(event_id, "\n".join(data), retry)
            event_id, data, retry, seen = None, [], None, False
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        seen = True
        if key == "id":
            event_id = value
        elif key == "data":
            data.append(value)
        elif key == "retry":
            retry = int(value)

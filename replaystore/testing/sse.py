"""A minimal SSE reader for tests and benchmarks that talk to MCP servers over raw HTTP.

Only what MCP servers send (``id``, ``data``, ``retry``; comments skipped), so
that a test sees exactly the events on the wire, with no client library
reconnecting or deduplicating behind its back.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["SSE", "sse_events", "sse_lines"]


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


class _Reader:
    """Lines in, events out: the state of one SSE body between its lines."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self.event_id: str | None = None
        self.data: list[str] = []
        self.retry: int | None = None
        self.seen = False

    def line(self, line: str) -> SSE | None:
        """Take one line (without its end); the event it completes, if any."""
        if line == "":
            event = SSE(self.event_id, "\n".join(self.data), self.retry) if self.seen else None
            self._start()
            return event
        if line.startswith(":"):
            return None
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        self.seen = True
        if key == "id":
            self.event_id = value
        elif key == "data":
            self.data.append(value)
        elif key == "retry":
            self.retry = int(value)
        return None


async def sse_events(response: _Lines) -> AsyncIterator[SSE]:
    """The events of an SSE body (an ``httpx.Response`` opened with ``stream``)."""
    reader = _Reader()
    async for line in response.aiter_lines():
        event = reader.line(line)
        if event is not None:
            yield event


def sse_lines(lines: Iterable[str]) -> Iterator[SSE]:
    """The events of an SSE body read line by line (each without its line end)."""
    reader = _Reader()
    for line in lines:
        event = reader.line(line)
        if event is not None:
            yield event

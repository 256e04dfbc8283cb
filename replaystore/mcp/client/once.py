"""Client side: every server-sent event reaches the application once, whatever the client resends.

A client that resumes a stream with a ``Last-Event-ID`` older than the last
event it handed on (the SDK's client does, when a reconnection fails and it
tries again with the id it started from) gets the events in between a second
time, exactly as the server must replay them, and hands them to the
application again: a progress of ``[1, 2, 2, 3]``. The server cannot tell a
stale id from a real one; the client can, since it knows what it delivered.

:class:`OncePerStream` is an ``httpx2`` transport (the HTTP client of the SDK
and of FastMCP) that remembers, per stream of each session, the event ids it
passed on, and drops an event it already passed. A stream is known by the
request that opened it: a POST opens a new one; a GET with ``Last-Event-ID``
continues the stream that id was seen on; a plain GET is the session's
standalone stream. :class:`~replaystore.mcp.client.DesyncWatch` and
:class:`~replaystore.mcp.client.ResumingSession` use it.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx2

__all__ = ["OncePerStream"]

#: Streams remembered per transport (the oldest are forgotten first).
_STREAMS = 1024
#: Event ids remembered, over all streams, to know which stream a Last-Event-ID continues.
_IDS = 1 << 17

_Key = tuple[str, str]


class OncePerStream(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport that passes each SSE event of a stream on at most once."""

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()
        self._delivered: dict[_Key, set[str]] = {}
        self._stream_of: dict[_Key, _Key] = {}
        self._ids = itertools.count()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if "text/event-stream" not in response.headers.get("content-type", ""):
            return response
        session = str(
            request.headers.get("mcp-session-id") or response.headers.get("mcp-session-id", "")
        )
        last = request.headers.get("last-event-id")
        if last is not None:
            key = self._stream_of.get((session, last), (session, f"#{next(self._ids)}"))
        elif request.method == "GET":
            key = (session, "GET")
        else:
            key = (session, f"#{next(self._ids)}")
        inner = response.stream
        assert isinstance(inner, httpx2.AsyncByteStream)
        response.stream = _Once(inner, self, key)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()

    def seen(self, key: _Key, event_id: str) -> bool:
        """True if ``event_id`` was already passed on in this stream; else remember it."""
        ids = self._delivered.get(key)
        if ids is None:
            ids = self._delivered[key] = set()
            if len(self._delivered) > _STREAMS:
                del self._delivered[next(iter(self._delivered))]
        if event_id in ids:
            return True
        ids.add(event_id)
        self._stream_of[(key[0], event_id)] = key
        if len(self._stream_of) > _IDS:
            del self._stream_of[next(iter(self._stream_of))]
        return False


class _Once(httpx2.AsyncByteStream):
    """An SSE body with the events already passed on in its stream left out."""

    def __init__(self, inner: httpx2.AsyncByteStream, once: OncePerStream, key: _Key) -> None:
        self._inner = inner
        self._once = once
        self._key = key

    async def __aiter__(self) -> AsyncIterator[bytes]:
        buffer = b""
        scanned = 0
        async for chunk in self._inner:
            buffer += chunk
            while True:
                end = _frame_end(buffer, max(0, scanned - 3))
                if end is None:
                    scanned = len(buffer)
                    break
                frame, buffer, scanned = buffer[:end], buffer[end:], 0
                if not self._duplicate(frame):
                    yield frame
        if buffer:
            yield buffer

    def _duplicate(self, frame: bytes) -> bool:
        for line in frame.splitlines():
            if line.startswith(b"id:"):
                value = line[3:]
                event_id = (value[1:] if value.startswith(b" ") else value).decode(
                    "utf-8", "replace"
                )
                return bool(event_id) and self._once.seen(self._key, event_id)
        return False

    async def aclose(self) -> None:
        await self._inner.aclose()


def _frame_end(buffer: bytes, start: int) -> int | None:
    """The end (separator included) of the first complete SSE event in ``buffer``, if any."""
    ends: list[Any] = []
    for separator in (b"\r\n\r\n", b"\n\n", b"\r\r"):
        at = buffer.find(separator, start)
        if at >= 0:
            ends.append(at + len(separator))
    return min(ends) if ends else None

"""Stored messages written as server-sent events, byte for byte as the SDK writes them.

The store keeps each message as exactly the JSON the SDK puts in an SSE
``data:`` field (:func:`~replaystore.mcp.sessions.messages.encode_message`),
so a replay needs no model: the stored bytes go on the wire as they are,
framed as the SDK's SSE library (``sse_starlette``) frames them: ``id``, then
``event: message``, then ``data``, lines ended by CRLF, a blank line after
each event.

A resume whose replay holds its stream's response is written here in one
piece (:func:`answer_whole`): a response start and one body, instead of a
streaming response with its sender, pinger and disconnect watcher, none of
which has anything to do when the answer is complete before it starts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.streamable_http import CONTENT_TYPE_SSE, MCP_SESSION_ID_HEADER, SSEEvent
from starlette.types import Send

from ...verdicts import Event
from .messages import ids_of, payloads_of

__all__ = ["SSE_HEADERS", "Handed", "answer_whole", "event_data", "event_frame", "sse_headers"]

#: The headers of every SSE response of a session, before its id (the SDK's,
#: then what its SSE library sets: ``Connection`` and ``X-Accel-Buffering``).
SSE_HEADERS: Mapping[str, str] = {
    "Cache-Control": "no-cache, no-transform",
    "Connection": "keep-alive",
    "Content-Type": CONTENT_TYPE_SSE,
}

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def sse_headers(session_id: str | None) -> dict[str, str]:
    """The headers a streaming SSE response of this session is given (it adds its own)."""
    headers = dict(SSE_HEADERS)
    if session_id:
        headers[MCP_SESSION_ID_HEADER] = session_id
    return headers


def _raw_headers(session_id: str | None) -> list[tuple[bytes, bytes]]:
    """:func:`sse_headers` as the SSE library sends them: lower-cased, its two added."""
    if session_id:
        return [*_RAW_SSE_HEADERS, (_RAW_SESSION_HEADER, session_id.encode("latin-1")), _RAW_LAST]
    return [*_RAW_SSE_HEADERS, _RAW_LAST]


# Encoded once: every whole answer starts with them.
_RAW_SSE_HEADERS = tuple(
    (name.lower().encode(), value.encode()) for name, value in SSE_HEADERS.items()
)
_RAW_SESSION_HEADER = MCP_SESSION_ID_HEADER.encode("latin-1")
_RAW_LAST = (b"x-accel-buffering", b"no")


def event_data(event: Event) -> dict[str, Any]:
    """A stored message as the SDK's event data (what its SSE library encodes)."""
    assert event.payload is not None
    return {"event": "message", "data": event.payload.decode("utf-8"), "id": event.event_id}


def event_frame(event: Event) -> bytes:
    """A stored message as the bytes of one SSE event (``event_data``, encoded)."""
    payload = event.payload
    assert payload is not None
    if b"\n" in payload or b"\r" in payload:  # never in JSON the SDK wrote; framed all the same
        data = b"".join(b"data: " + line + b"\r\n" for line in _LINE_BREAK.split(payload))
    else:
        data = b"data: " + payload + b"\r\n"
    event_id = _LINE_BREAK.sub(b"", event.event_id.encode("utf-8"))
    return b"id: " + event_id + b"\r\nevent: message\r\n" + data + b"\r\n"


async def answer_whole(send: Send, session_id: str | None, events: Sequence[Event]) -> None:
    """A complete SSE answer (status 200) in one body: the events, then the end."""
    await send({"type": "http.response.start", "status": 200, "headers": _raw_headers(session_id)})
    await send({"type": "http.response.body", "body": whole_body(events), "more_body": False})


def whole_body(events: Sequence[Event]) -> bytes:
    """The events as one SSE body, joined in one step: :func:`event_frame` of each, in order.

    Stored JSON and the ids issued here hold no line break, so each frame is
    ``id: <id>`` CRLF ``event: message`` CRLF ``data: <payload>`` CRLF CRLF.
    A replay's cost is in the steps taken per event, not in the bytes: the
    events are taken apart into their ids and payloads (a
    :class:`~replaystore.verdicts.Replay`'s own columns), whether any id or payload
    holds a CR or an LF is asked of all of them at once (a byte search of
    each joined text, not a test per event), and the frames are laid out by
    slice into one list of pieces, joined once. A replay holding a line
    break is framed event by event, as :func:`event_frame` frames it (line
    breaks split or dropped). Priming events are never given: they are not
    replayed.
    """
    if not events:
        return b""
    ids = ids_of(events)  # a replay's columns: no event built
    payloads: Sequence[bytes] = payloads_of(events)  # type: ignore[assignment]  # none priming
    text = "\n".join(ids)
    joined = b"".join(payloads)
    id_bytes = text.encode().split(b"\n")  # one more piece than ids if an id holds an LF
    if (
        joined.find(b"\n") >= 0
        or joined.find(b"\r") >= 0
        or text.find("\r") >= 0
        or len(id_bytes) != len(ids)
    ):
        return b"".join(map(event_frame, events))
    pieces: list[bytes | None] = [b"id: ", None, _FRAME_MIDDLE, None, b"\r\n\r\n"] * len(ids)
    pieces[1::5] = id_bytes
    pieces[3::5] = payloads
    return b"".join(pieces)  # type: ignore[arg-type]  # every piece set


_FRAME_MIDDLE = b"\r\nevent: message\r\ndata: "


class Handed:
    """A streaming response's events as its writer hands them, each reported as it is taken.

    ``taken`` gets the event's id the moment the response takes it from the
    writer, with nothing awaited in between: an event the response writes is
    reported before it is written, even when its writer was cancelled in
    the middle of handing it over.
    """

    def __init__(
        self, events: MemoryObjectReceiveStream[SSEEvent], taken: Callable[[str], None]
    ) -> None:
        self._events = events
        self._taken = taken

    def __aiter__(self) -> Handed:
        return self

    async def __anext__(self) -> SSEEvent:
        event = await self._events.__anext__()
        event_id = event.get("id")
        if event_id:
            self._taken(event_id)
        return event

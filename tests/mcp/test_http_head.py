"""A request's head read once (``Head``): what Starlette's ``Request.headers`` would say."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from replaystore.mcp.http_head import LAST_EVENT_ID, Head

RAW = [
    (b"host", b"first.example"),
    (b"accept", b"text/event-stream"),
    (b"host", b"second.example"),  # repeated: the first one counts
    (b"last-event-id", b"caf\xc3\xa9"),  # UTF-8 bytes, read as Latin-1 as Starlette does
    (b"x-empty", b""),
]


@pytest.mark.parametrize(
    "name", ["host", "Host", "accept", "last-event-id", "x-empty", "origin", "ORIGIN"]
)
def test_a_head_answers_as_starlettes_headers_do(name: str) -> None:
    scope = {"type": "http", "headers": RAW}
    head = Head(scope)
    assert head.get(name) == Headers(scope=scope).get(name)
    assert head.headers.get(name, "fallback") == Headers(scope=scope).get(name, "fallback")
    assert head.text(name.lower().encode()) == Headers(scope=scope).get(name)


def test_a_head_tells_which_headers_were_sent() -> None:
    head = Head({"type": "http", "headers": RAW})
    assert head.has(LAST_EVENT_ID)
    assert head.has(b"x-empty")
    assert not head.has(b"content-length")

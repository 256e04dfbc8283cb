"""A request's head: a bound on its size under httptools, and its headers read once.

:class:`Head` reads a request's headers in one step, for the code that
answers a resume before any framework has looked at it.


uvicorn picks httptools over h11 when it is installed (``uvicorn[standard]``).
h11 refuses a head that grows past its buffer limit (``400``); uvicorn's
httptools protocol has no limit at all: it keeps every byte of a header line
until the line ends, so one client can make a replica hold megabytes per
connection (a 20 MB header is read and served). :class:`BoundedHttpTools`
counts the bytes received while a head is incomplete and answers
``431 Request Header Fields Too Large`` (and closes the connection) once they
pass :data:`MAX_HEAD_BYTES`, before the request reaches the application.
:func:`http_protocol` is what to hand ``uvicorn.Config(http=...)``: this class
when httptools is installed, else uvicorn's own choice (h11, bounded already).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from mcp.server.streamable_http import LAST_EVENT_ID_HEADER, MCP_SESSION_ID_HEADER
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from starlette.types import Scope

__all__ = [
    "LAST_EVENT_ID",
    "MAX_HEAD_BYTES",
    "PROTOCOL_VERSION",
    "SESSION_ID",
    "Head",
    "http_protocol",
]

#: The MCP headers :meth:`Head.text` is asked for, as ASGI servers give names.
LAST_EVENT_ID = LAST_EVENT_ID_HEADER.lower().encode("ascii")
SESSION_ID = MCP_SESSION_ID_HEADER.lower().encode("ascii")
PROTOCOL_VERSION = MCP_PROTOCOL_VERSION_HEADER.lower().encode("ascii")

#: Bytes of a request head accepted: a 60 KB ``Last-Event-ID`` or session id
#: still reaches the application (and gets its verdict), a larger head does not.
MAX_HEAD_BYTES = 64 * 1024

_TOO_LARGE = b"Request header fields too large."


class Head:
    """A request's headers, read once: each name's first value, as Starlette reads it (Latin-1).

    Built in one step from the ASGI scope, where a Starlette ``Request``
    scans and decodes every header again for each one it is asked for. It
    also stands in for a ``Request`` where only ``request.headers.get`` is
    read (the SDK's host, origin and ``Accept`` checks).
    """

    __slots__ = ("_raw",)

    def __init__(self, scope: Scope) -> None:
        # Reversed, so the first of repeated names wins, as with Starlette.
        self._raw: dict[bytes, bytes] = dict(reversed(scope["headers"]))

    @property
    def headers(self) -> Head:
        return self

    def get(self, name: str, default: str | None = None) -> str | None:
        value = self._raw.get(name.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    def text(self, name: bytes) -> str | None:
        """The header ``name`` (lower case, as ASGI servers give it) as text, or None."""
        value = self._raw.get(name)
        return None if value is None else value.decode("latin-1")

    def has(self, name: bytes) -> bool:
        """Whether the header ``name`` (lower case, as ASGI servers give it) was sent."""
        return name in self._raw


def http_protocol() -> Any:
    """The ``http`` setting of ``uvicorn.Config``: heads bounded whichever parser serves."""
    if importlib.util.find_spec("httptools") is None:
        return "auto"
    return _bounded_class()


class _HeadTooLarge(Exception):
    """Raised from the parser's callback: httptools stops there, uvicorn answers an error."""


def _bounded_class() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpTools(HttpToolsProtocol):
        """uvicorn's httptools protocol, refusing a head larger than :data:`MAX_HEAD_BYTES`.

        Two checks: the bytes received while a head is still incomplete (what
        httptools holds, never more than the bound and one read), and the
        size of a head that completed within one read (counted from what it
        parsed, so that a body read with its head is not counted).
        """

        _head_bytes = 0  # received since the head began (reads that began in it)
        _carry = 0  # the read in which the last request ended: the head may begin in it
        _read = 0
        _in_head = True
        _too_large = False

        def data_received(self, data: bytes) -> None:
            self._read = len(data)
            if self._in_head:
                self._head_bytes += self._read
            super().data_received(data)
            if self._in_head and self._head_bytes > MAX_HEAD_BYTES:
                self._too_large = True
                self.send_400_response("")

        def on_headers_complete(self) -> None:
            # The head came in the reads counted, and maybe in part of the one
            # that ended the request before: only when those could exceed the
            # bound is the head itself measured.
            if self._head_bytes + self._carry > MAX_HEAD_BYTES and (
                len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
                > MAX_HEAD_BYTES
            ):
                self._too_large = True
                raise _HeadTooLarge  # uvicorn answers (send_400_response below); the app is not run
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._head_bytes, self._carry = True, 0, self._read

        def send_400_response(self, msg: str) -> None:
            if not self._too_large:
                super().send_400_response(msg)
                return
            if self.transport.is_closing():
                return
            self.logger.warning("Request head over %d bytes refused.", MAX_HEAD_BYTES)
            head = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: %d\r\n" % len(_TOO_LARGE),
                b"connection: close\r\n\r\n",
                _TOO_LARGE,
            ]
            self.transport.write(b"".join(head))
            self.transport.close()

    return BoundedHttpTools

"""A hand-driven MCP session over streamable HTTP, for tests and benchmarks that talk raw HTTP.

No MCP client library sits between the caller and the wire: nothing
reconnects, deduplicates or retries behind its back, so a test can drop a
connection at an exact point, send any ``Last-Event-ID``, and read the status
and body of a refused resume; a benchmark measures the server, not a client.
The session keeps what the protocol asks a client to keep: its id (sent as
``Mcp-Session-Id``), the protocol version (``MCP-Protocol-Version``) and
request ids of its own. Events are read with :func:`.sse.sse_events`.

Needs ``httpx`` (in the ``bench`` and ``dev`` extras).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from .sse import SSE, sse_events

__all__ = [
    "PROTOCOL",
    "RawSession",
    "Refused",
    "initialize_message",
    "post_headers",
    "stream_headers",
]

#: The protocol version the session speaks unless told otherwise.
PROTOCOL = "2025-11-25"


def initialize_message(version: str = PROTOCOL) -> dict[str, Any]:
    """The ``initialize`` request (id 0) that opens a session of protocol ``version``."""
    return {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }


def post_headers(session_id: str = "", version: str = PROTOCOL, **extra: str) -> dict[str, str]:
    """A POST's headers: what it accepts, the protocol version, the session id if any; ``extra``."""
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": version,
    }
    if session_id:
        headers["mcp-session-id"] = session_id
    headers.update(extra)
    return headers


def stream_headers(
    session_id: str, last_event_id: str | None = None, version: str = PROTOCOL
) -> dict[str, str]:
    """A GET's headers: the session's SSE stream, resumed after ``last_event_id`` if given."""
    extra = {"accept": "text/event-stream"}
    if last_event_id is not None:
        extra["last-event-id"] = last_event_id
    headers = post_headers(session_id, version, **extra)
    headers.pop("content-type")
    return headers


class Refused(Exception):
    """The server did not accept a request the session needs: what it answered.

    ``retry_after`` is the ``Retry-After`` header, if any (a server shedding
    load answers 503 with one).
    """

    def __init__(self, step: str, response: httpx.Response, body: bytes) -> None:
        super().__init__(f"{step}: HTTP {response.status_code}: {body[:200]!r}")
        self.status = response.status_code
        self.retry_after = response.headers.get("retry-after")


@dataclass
class RawSession:
    """One MCP session at ``url``, driven by hand over ``client``.

    ``session_id`` is empty until :meth:`initialize`; a session made with the
    id of another (and its ``next_id``) continues it, at another replica too.
    ``url`` may change between requests (a client sent to another replica).
    """

    client: httpx.AsyncClient
    url: str
    session_id: str = ""
    next_id: int = 1
    version: str = PROTOCOL

    def headers(self, **extra: str) -> dict[str, str]:
        """This session's :func:`post_headers`, with ``extra``."""
        return post_headers(self.session_id, self.version, **extra)

    async def initialize(self) -> RawSession:
        """``initialize`` and ``notifications/initialized``; :class:`Refused` if not accepted."""
        body = initialize_message(self.version)
        async with self.client.stream("POST", self.url, json=body, headers=self.headers()) as r:
            if r.status_code != 200:
                raise Refused("initialize", r, await r.aread())
            self.session_id = r.headers["mcp-session-id"]
            async for event in sse_events(r):
                if event.message and event.message.get("id") == 0:
                    break
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        r2 = await self.client.post(self.url, json=note, headers=self.headers())
        if r2.status_code != 202:
            raise Refused("notifications/initialized", r2, r2.content)
        return self

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The next request id and a JSON-RPC request of ``method`` with it."""
        request_id = self.next_id
        self.next_id += 1
        return request_id, {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}

    def call(
        self, tool: str, arguments: dict[str, Any], token: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        """A ``tools/call`` request (:meth:`request`), with a progress token if given."""
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if token is not None:
            params["_meta"] = {"progressToken": token}
        return self.request("tools/call", params)

    @contextlib.asynccontextmanager
    async def post(self, body: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        """POST ``body`` in the session; the response, its body not read yet."""
        async with self.client.stream("POST", self.url, json=body, headers=self.headers()) as r:
            yield r

    @contextlib.asynccontextmanager
    async def get(self, last_event_id: str | None = None) -> AsyncIterator[httpx.Response]:
        """GET the session's stream (a resume after ``last_event_id``); its body not read yet."""
        headers = stream_headers(self.session_id, last_event_id, self.version)
        async with self.client.stream("GET", self.url, headers=headers) as r:
            yield r

    async def ping_status(self) -> int:
        """The HTTP status of a ``ping``."""
        _, body = self.request("ping", {})
        r = await self.client.post(self.url, json=body, headers=self.headers())
        await r.aread()
        return r.status_code

    async def run(
        self, tool: str, arguments: dict[str, Any], token: str | None = None
    ) -> list[SSE]:
        """Call a tool on a fresh POST stream; its events up to the result (or the stream's end).

        :class:`Refused` when the call is not answered with a stream (200).
        """
        request_id, body = self.call(tool, arguments, token)
        events: list[SSE] = []
        async with self.post(body) as r:
            if r.status_code != 200:
                raise Refused("tools/call", r, await r.aread())
            async for event in sse_events(r):
                events.append(event)
                message = event.message
                if message and message.get("id") == request_id and "result" in message:
                    break
        return events

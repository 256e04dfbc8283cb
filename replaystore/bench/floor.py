"""The floor of ``bench storm --http``: the storm served with the least work Python can do.

``python -m replaystore.bench.floor --port P --url redis://… --prefix P``

A bare ASGI application (raw ``receive``/``send`` and ``redis.asyncio``; no
Starlette, no SSE library, no MCP SDK) that answers the storm's requests just
enough for its clients to run, so the replica CPU a resume costs every other
server can be read against what the same work costs at the least:

- ``initialize``: a session id, kept in this process's memory (sticky, as a
  session of the SDK's own servers);
- a notification: ``202``;
- ``tools/call`` of ``countdown``: what the example server's tool sends, byte
  for byte the same JSON-RPC messages (progress token, progress, total,
  message, then the result), each with an event id. The events after
  ``close_after`` are pushed to one Redis list per session (``RPUSH``, each
  stored as the SSE text it is sent as), then the response sends the priming
  event and the first ``close_after`` notifications and ends, as the real
  servers close the stream there;
- ``GET`` with ``Last-Event-ID``: **one** ``LRANGE`` of that list from the
  cursor's own event, written back in one ``send``; then the response ends.
  A cursor of another session (``foreign``) is refused without a read, one
  past the list's end (``ahead``) by the read coming back empty: ``404``
  with a verdict, as replaystore answers both.

An event id is ``<the session's first 12 hex digits>-<its ordinal>``: the
form of replaystore's cursors, so the storm forges an ``ahead`` id for the
floor the way it does for replaystore.

uvicorn runs it with the settings of ``replaystore example-server`` as the
storm starts it: uvicorn's defaults (event loop, HTTP implementation, access
log), ``log_level="error"`` and the drain's graceful-shutdown timeout.
"""

from __future__ import annotations

import argparse
import json
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = ["Floor", "main"]

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

RETRY_INTERVAL_MS = 100  # as replaystore's example server
_EPOCH = 12  # hex digits of a session id an event id starts with
_DRAIN_SECONDS = 10  # the example server's graceful-shutdown timeout

_SSE = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]
_JSON = [(b"content-type", b"application/json")]


def _frame(event_id: str, message: dict[str, Any]) -> str:
    """One SSE event as the SDK writes it (compact JSON, ``event: message``)."""
    data = json.dumps(message, separators=(",", ":"))
    return f"id: {event_id}\nevent: message\ndata: {data}\n\n"


def _not_found(verdict: str, why: str) -> bytes:
    error = {"code": -32600, "message": f"Not Found: {why}", "data": {"verdict": verdict}}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = _JSON
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Floor:
    """The ASGI application: sessions in this process, each call's later events in Redis."""

    def __init__(self, url: str, prefix: str, retry_ms: int = RETRY_INTERVAL_MS) -> None:
        self._url = url
        self._prefix = prefix
        self._retry = retry_ms
        self._redis: Any = None
        # Session id -> the ordinal of the first event in its list (0: no call yet).
        self._sessions: dict[str, int] = {}

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] != "http":
            return
        elif scope["method"] == "GET":
            await self._get(scope, send)
        elif scope["method"] == "POST":
            await self._post(scope, receive, send)
        else:
            await _respond(send, 405, b"")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """The Redis client lives on the server's event loop, closed when it stops."""
        import redis.asyncio

        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._redis = redis.asyncio.Redis.from_url(self._url)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._redis is not None:
                    await self._redis.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _post(self, scope: Message, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        method = request.get("method")
        if method == "initialize":
            await self._initialize(request, send)
        elif "id" not in request:  # a notification
            await _respond(send, 202, b"")
        elif method == "tools/call":
            await self._call(_header(scope, b"mcp-session-id"), request, send)
        else:
            await _respond(send, 400, b"")

    async def _initialize(self, request: dict[str, Any], send: Send) -> None:
        session = secrets.token_hex(16)
        self._sessions[session] = 0
        result = {
            "capabilities": {"tools": {"listChanged": False}},
            "protocolVersion": request["params"]["protocolVersion"],
            "serverInfo": {"name": "bench-floor", "version": ""},
        }
        body = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result})
        headers = [*_JSON, (b"mcp-session-id", session.encode())]
        await _respond(send, 200, body.encode(), headers)

    async def _call(self, session: str, request: dict[str, Any], send: Send) -> None:
        """``countdown``: the later events stored, the first ones sent, the stream closed."""
        if session not in self._sessions:
            await _respond(send, 404, _not_found("unknown_session", "no such session"))
            return
        params = request["params"]
        n, close_after = params["arguments"]["n"], params["arguments"].get("close_after", 0)
        token = params.get("_meta", {}).get("progressToken")
        epoch = session[:_EPOCH]
        frames = [
            _frame(
                f"{epoch}-{i + 1}",
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {
                        "progressToken": token,
                        "progress": i + 1,
                        "total": n,
                        "message": f"{n - i - 1} left",
                    },
                },
            )
            for i in range(n)
        ]
        text = f"done {n}"
        result = {
            "content": [{"text": text, "type": "text"}],
            "isError": False,
            "structuredContent": {"result": text},
        }
        frames.append(
            _frame(f"{epoch}-{n + 1}", {"jsonrpc": "2.0", "id": request["id"], "result": result})
        )
        shown = close_after if 0 < close_after < n else len(frames)
        if shown < len(frames):
            await self._redis.rpush(self._prefix + session, *frames[shown:])
        self._sessions[session] = shown + 1
        priming = f"id: {epoch}-0\ndata: \nretry: {self._retry}\n\n"
        await _respond(send, 200, "".join([priming, *frames[:shown]]).encode(), _SSE)

    async def _get(self, scope: Message, send: Send) -> None:
        """A resume: one ``LRANGE`` from the cursor's own event, sent in one piece."""
        session = _header(scope, b"mcp-session-id")
        first = self._sessions.get(session)
        if first is None:
            await _respond(send, 404, _not_found("unknown_session", "no such session"))
            return
        epoch, _, ordinal = _header(scope, b"last-event-id").partition("-")
        if epoch != session[:_EPOCH] or not ordinal.isdigit():
            await _respond(send, 404, _not_found("foreign_cursor", "not an event of this session"))
            return
        # The cursor's own event is read too (unless it was sent, not stored): an
        # empty read says the cursor is past the end, a one-event read that it is at it.
        start = int(ordinal) - first
        if start < -1:  # events sent on the call's stream and never stored
            await _respond(send, 404, _not_found("not_stored", "events before the stored ones"))
            return
        events = await self._redis.lrange(self._prefix + session, max(0, start), -1)
        if not events:
            await _respond(send, 404, _not_found("ahead_of_high_water", "cursor past the end"))
            return
        await _respond(send, 200, b"".join(events[1:] if start >= 0 else events), _SSE)


def _header(scope: Message, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m replaystore.bench.floor")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--url", required=True, help="the Redis the events go to")
    parser.add_argument("--prefix", default="", help="prefix of every key")
    args = parser.parse_args(argv)
    uvicorn.run(
        Floor(args.url, args.prefix),
        host=args.host,
        port=args.port,
        log_level="error",
        timeout_graceful_shutdown=_DRAIN_SECONDS,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

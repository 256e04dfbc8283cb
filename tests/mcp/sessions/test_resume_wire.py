"""A finished stream's resume is written as stored: the same bytes as the SDK writes, no pub/sub.

A resume whose replay holds the call's response is answered without a model,
a streaming response, a subscription or a takeover. What a client sees must
not change: each event framed byte for byte as the SDK frames it (checked
against the SDK's own formatting of the decoded message, and against the
bytes of the very POST that carried the call), the same headers, and the
same verdicts. What Redis sees shrinks: no SUBSCRIBE, no PUBLISH, no
UNSUBSCRIBE for such a resume, on the replica that ran the call or another.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from mcp.server.streamable_http import EventMessage, StreamableHTTPServerTransport
from mcp_types import (
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
)
from sse_starlette import EventSourceResponse, ServerSentEvent

from replaystore.mcp.sessions.messages import (
    decode_message,
    encode_message,
    first_response,
    is_response_payload,
)
from replaystore.mcp.sessions.sse import _raw_headers, event_frame, sse_headers, whole_body
from replaystore.testing.servers import ServerHandle
from replaystore.testing.sse import sse_events
from replaystore.verdicts import Event
from tests.mcp._support import RawSession, ServerProcess, replica_pair, result_text

pytestmark = pytest.mark.anyio

MESSAGES = [
    JSONRPCNotification(
        jsonrpc="2.0",
        method="notifications/progress",
        params={"progressToken": "t", "progress": 1, "total": 3, "message": "2 left"},
    ),
    JSONRPCNotification(
        jsonrpc="2.0",
        method="notifications/message",
        params={"level": "info", "data": 'line one\nline two\r\u2028 \u00e9\U0001f600 "q"'},
    ),
    JSONRPCRequest(jsonrpc="2.0", id="r-1", method="elicitation/create", params={"x": [1, 2.5]}),
    JSONRPCResponse(jsonrpc="2.0", id=7, result={"content": [{"type": "text", "text": "ok"}]}),
    JSONRPCError(jsonrpc="2.0", id="7", error={"code": -32000, "message": "no", "data": None}),
]


def _sdk_frame(event_id: str, payload: bytes) -> bytes:
    """How the SDK writes a stored message: decoded, its event data built, encoded as SSE."""
    data = StreamableHTTPServerTransport._create_event_data(
        None,  # type: ignore[arg-type]  # the method reads nothing of its transport
        EventMessage(decode_message(payload), event_id),
    )
    return ServerSentEvent(**data).encode()


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_a_stored_message_is_framed_as_the_sdk_frames_it(
    message: JSONRPCNotification | JSONRPCRequest | JSONRPCResponse | JSONRPCError,
) -> None:
    payload = encode_message(message)
    event = Event("0:1:2:3", "7", 3, payload)
    assert event_frame(event) == _sdk_frame(event.event_id, payload)
    assert is_response_payload(payload) == isinstance(message, JSONRPCResponse | JSONRPCError)


def test_a_whole_body_is_the_sdk_frames_of_its_events_in_order() -> None:
    events = [
        Event(f"0:1:2:{i}", "7", i, encode_message(message)) for i, message in enumerate(MESSAGES)
    ]
    expected = b"".join(_sdk_frame(event.event_id, event.payload or b"") for event in events)
    assert whole_body(events) == expected
    assert whole_body([]) == b""


@pytest.mark.parametrize(
    ("event_id", "payload"),
    [
        ("0:1:2:3", b'{"a":\n1}'),  # a raw line break no encoder writes, in the payload
        ("0:1:2:3", b'{"a":\r1}'),
        ("0:1:2:3", b'{"a":\r\n1}'),
        ("0:1\r\n:2:3", b"{}"),  # and in an id
        ("0:1\n:2:3", b"{}"),
        ("0:1\r:2:3", b"{}"),
    ],
)
def test_a_line_break_in_a_stored_event_is_framed_as_event_frame_frames_it(
    event_id: str, payload: bytes
) -> None:
    plain = Event("0:1:2:4", "7", 4, b'{"b":2}')
    events = [plain, Event(event_id, "7", 3, payload), plain]
    body = whole_body(events)
    assert body == b"".join(map(event_frame, events))
    assert body.count(b"\r\n\r\n") == 3  # one frame per event, no line break left unframed


def test_a_whole_answer_has_the_headers_of_the_streaming_one() -> None:
    for session_id in ("a1b2", None):
        streaming = EventSourceResponse(content=iter(()), headers=sse_headers(session_id))
        assert _raw_headers(session_id) == streaming.raw_headers


def test_is_response_payload_reads_only_what_decides() -> None:
    assert not is_response_payload(b"not json")
    assert not is_response_payload(b"[1, 2]")
    assert not is_response_payload(b'{"jsonrpc":"2.0","id":1,"method":"x"}')
    assert is_response_payload(b'{ "id": 1, "jsonrpc": "2.0", "result": {} }')
    assert is_response_payload(b'{"jsonrpc":"2.0","id":"a\\",\\"result\\":","error":{}}')
    assert not is_response_payload(b'{"jsonrpc":"2.0","id":"a\\",\\"result\\":","method":"x"}')
    assert not is_response_payload(b'{"jsonrpc":"2.0","id":')


# ------------------------------------------------------------- on real servers


@pytest.fixture(scope="module")
def replicas(
    store: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    logs: Path = tmp_path_factory.mktemp("resume-wire")
    with replica_pair(f"{store.url}?prefix=rw:", logs) as started:
        yield started


def _pubsub_calls(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {
        name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for name in ("subscribe", "unsubscribe", "publish", "ssubscribe", "spublish")
    }


async def _resume_bytes(session: RawSession, url: str, cursor: str) -> tuple[httpx.Response, bytes]:
    session.url = url
    async with session.get(cursor) as response:
        body = await response.aread()
    return response, body


async def test_a_finished_resume_sends_the_calls_own_bytes_and_touches_no_pubsub(
    replicas: list[ServerProcess], store: ServerHandle, http: httpx.AsyncClient
) -> None:
    a, b = replicas
    session = await RawSession(http, a.url).initialize()
    _, body = session.call("countdown", {"n": 4, "interval_ms": 0}, token="t")
    async with session.post(body) as response:
        posted = await response.aread()
    # The POST's own bytes, as the SDK wrote them: its priming event, then the call's events.
    frames = [frame + b"\r\n\r\n" for frame in posted.split(b"\r\n\r\n") if frame]
    priming, *call_frames = frames
    cursor = priming.split(b"\r\n")[0].removeprefix(b"id: ").decode()
    assert len(call_frames) == 5 and b'"done 4"' in call_frames[-1]

    admin = redis.Redis.from_url(store.url)
    try:
        for replica in (a, b, a):  # the replica that ran the call, one that adopts it, again
            before = _pubsub_calls(admin)
            response, replayed = await _resume_bytes(session, replica.url, cursor)
            assert response.status_code == 200
            assert replayed == b"".join(call_frames)
            assert _pubsub_calls(admin) == before
            streaming = EventSourceResponse(
                content=iter(()), headers=sse_headers(session.session_id)
            )
            sent = [(k.encode().lower(), v.encode()) for k, v in response.headers.items()]
            for header in streaming.raw_headers:
                assert header in sent
    finally:
        admin.close()
    # Answered from the store alone: the other replica built no SDK session for it.
    assert f"adopted session {session.session_id}" not in b.log_tail(400)


async def test_a_resume_that_goes_live_subscribes_and_misses_nothing(
    replicas: list[ServerProcess], http: httpx.AsyncClient
) -> None:
    """The resumed stream's later events, appended by the other replica, arrive once each."""
    a, b = replicas
    session = await RawSession(http, a.url).initialize()
    request_id, body = session.call(
        "countdown", {"n": 6, "interval_ms": 300, "close_after": 1}, token="t"
    )
    async with session.post(body) as response:
        events = [event async for event in sse_events(response)]
    cursor = next(e.id for e in events if e.priming and e.id)
    session.url = b.url
    async with session.get(cursor) as response:
        assert response.status_code == 200
        resumed = [event async for event in sse_events(response)]
    progress = [
        e.message["params"]["progress"]
        for e in [*events, *resumed]
        if e.message and e.message.get("method") == "notifications/progress"
    ]
    assert progress == [1, 2, 3, 4, 5, 6]
    assert result_text(resumed[-1], request_id) == "done 6"
    # A stream that goes on live is followed by the session, adopted here.
    assert f"adopted session {session.session_id}" in b.log_tail(400)


async def test_a_failed_resume_on_a_replica_that_never_served_the_session_ends_it(
    replicas: list[ServerProcess], http: httpx.AsyncClient
) -> None:
    a, b = replicas
    mine = await RawSession(http, a.url).initialize()
    other = await RawSession(http, a.url).initialize()
    _, body = other.call("countdown", {"n": 2, "interval_ms": 0}, token="t")
    async with other.post(body) as response:
        events = [event async for event in sse_events(response)]
    foreign = next(e.id for e in events if e.priming and e.id)
    mine.url = b.url
    async with mine.get(foreign) as response:
        assert response.status_code == 404
        error = (await response.aread()).decode()
    assert '"verdict": "foreign_cursor"' in error
    mine.url = a.url
    assert await mine.ping_status() == 404  # ended on every replica, not only the one asked
    assert await other.ping_status() == 200  # the cursor's owner goes on


@pytest.mark.parametrize("request_id", [0, 7, -3, 12345678901234, "7", "a,b", 'q"x', "-1", 1.5])
@pytest.mark.parametrize(
    "tail", ['"result":{}', '"error":{"code":1,"message":"m"}', '"method":"x"']
)
def test_any_id_followed_by_any_field_is_told_a_response_or_not(
    request_id: object, tail: str
) -> None:
    """Numbers are told apart on the bytes, anything else by parsing the id: the same answers."""
    payload = ('{"jsonrpc":"2.0","id":' + json.dumps(request_id) + "," + tail + "}").encode()
    assert is_response_payload(payload) == (not tail.startswith('"method"'))


@pytest.mark.parametrize(
    "kinds",
    ["", "n", "r", "nnnr", "nnnnq", "nrn", "qnr", "rr", "nnn", "xr", "nnx", "q", "nqnnr", "nnqr"],
)
def test_first_response_is_the_first_payload_a_response(kinds: str) -> None:
    """n: a notification, r: a response (or error), q: a request, x: not JSON at all."""
    made = {
        "n": b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}',
        "r": b'{"jsonrpc":"2.0","id":7,"result":{}}',
        "q": b'{"jsonrpc":"2.0","id":8,"method":"ping"}',
        "x": b'{"jsonrpc":"2.0","method":',  # exactly a notification's beginning, and no more
    }
    payloads = [made[kind] for kind in kinds]
    expected = next((i for i, p in enumerate(payloads) if is_response_payload(p)), None)
    assert first_response(payloads) == expected
    assert expected == (kinds.index("r") if "r" in kinds else None)

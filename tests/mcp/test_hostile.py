"""Hostile input over HTTP against real MCP server processes (SDK and FastMCP) on a real Redis.

Whatever a client puts in ``Last-Event-ID``, ``Mcp-Session-Id``, a JSON-RPC
id or a request body, the server answers with a 4xx, a JSON-RPC error or a
verdict, never a 500 and never a traceback in the body; it stays up; each
request adds a bounded number of bytes to the server's log (the log file is
measured before and after every request); and a session survives any bad
request that is not a resumption (a failed resumption ends the session by
design). Requests go over raw sockets, so header bytes reach the server
exactly as generated (an HTTP client library would refuse or re-encode them).

Examples are bounded (hypothesis ``max_examples``) to keep the suite fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.cursor import Cursor
from replaystore.testing.mcp import initialize_message
from replaystore.testing.servers import ServerHandle, find_free_port
from tests.mcp._support import PV, ROOT, ServerProcess, wait_ready

#: Bytes one request may add to the server log (one WARNING record with evidence is ~1.5 KB,
#: wrapped over several lines by the SDK's console handler), and log records.
LOG_BYTES_PER_REQUEST = 4096
LOG_RECORDS_PER_REQUEST = 3
_RECORD = re.compile(rb"^(\[[^\]\n]*\]\s+|\s*)(DEBUG|INFO|WARNING|ERROR|CRITICAL)[\s:]", re.M)
SOCKET_TIMEOUT = 20.0
EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Target:
    server: ServerProcess

    @property
    def log(self) -> Path:
        return self.server.log_path

    def log_size(self) -> int:
        return self.log.stat().st_size

    def request(
        self,
        method: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes = b"",
        *,
        stream_ok: bool = False,
    ) -> Reply:
        """One request on a fresh connection; checks the rules every answer must keep."""
        before = self.log_size()
        reply = raw_request(self.server.port, method, headers, body, stream_ok=stream_ok)
        assert self.server.proc.poll() is None, f"server died:\n{self.server.log_tail()}"
        assert (reply.status != 500 and reply.status < 500) or reply.status == 503, (
            f"{reply.status}: {reply.body[:300]!r}\n{self.server.log_tail(20)}"
        )
        for marker in (b"Traceback", b'File "', b"Internal Server Error"):
            assert marker not in reply.body, f"{marker!r} in body: {reply.body[:300]!r}"
        grown = self.log.read_bytes()[before:]
        assert len(grown) <= LOG_BYTES_PER_REQUEST, (
            f"one request wrote {len(grown)} log bytes:\n{grown[:600]!r}"
        )
        records = len(_RECORD.findall(grown))
        assert records <= LOG_RECORDS_PER_REQUEST, f"{records} log records:\n{grown[:600]!r}"
        return reply

    def new_session(self) -> str:
        init = initialize_message()
        reply = self.request("POST", base_headers(), json.dumps(init).encode())
        assert reply.status == 200, reply.body
        session = reply.headers["mcp-session-id"]
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
        assert self.request("POST", base_headers(session), note).status == 202
        return session

    def ping(self, session: str) -> int:
        body = json.dumps({"jsonrpc": "2.0", "id": 99, "method": "ping"}).encode()
        return self.request("POST", base_headers(session), body).status

    def first_event_id(self, session: str) -> str:
        """Call countdown(2) and return the first SSE id of its stream (a valid cursor)."""
        reply = self.request("POST", base_headers(session), tool_call(1, 2))
        assert reply.status == 200, reply.body
        ids = [line[3:].strip() for line in reply.body.decode().splitlines() if line[:3] == "id:"]
        assert ids, reply.body
        return ids[0]


def base_headers(session: str | None = None) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"accept", b"application/json, text/event-stream"),
        (b"content-type", b"application/json"),
        (b"mcp-protocol-version", PV.encode()),
    ]
    if session is not None:
        headers.append((b"mcp-session-id", session.encode()))
    return headers


def get_headers(session: str, last_event_id: bytes) -> list[tuple[bytes, bytes]]:
    return [
        (b"accept", b"text/event-stream"),
        (b"mcp-protocol-version", PV.encode()),
        (b"mcp-session-id", session.encode()),
        (b"last-event-id", last_event_id),
    ]


def tool_call(request_id: Any, n: int = 1, *, progress: bool = False) -> bytes:
    params: dict[str, Any] = {"name": "countdown", "arguments": {"n": n, "interval_ms": 0}}
    if progress:
        params["_meta"] = {"progressToken": "p"}
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    ).encode()


def raw_request(
    port: int,
    method: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    *,
    stream_ok: bool,
) -> Reply:
    """Send the bytes as given; read the answer (only its head for a live 200 event stream)."""
    head = [f"{method} /mcp HTTP/1.1".encode(), f"host: 127.0.0.1:{port}".encode()]
    head += [name + b": " + value for name, value in headers]
    head += [b"connection: close", f"content-length: {len(body)}".encode()]
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT) as sock:
        # The server may answer (and close) before reading everything: read its answer.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            data += chunk
        if not data:  # closed without a word: a refusal, not an error page
            return Reply(0, {}, b"")
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        reply_headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            reply_headers[name.strip().lower()] = value.strip()
        live = status == 200 and "text/event-stream" in reply_headers.get("content-type", "")
        if live and stream_ok:
            return Reply(status, reply_headers, rest)
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:  # refused while the request was still being sent
                break
            if not chunk:
                break
            rest += chunk
    if reply_headers.get("transfer-encoding") == "chunked":
        rest = _dechunk(rest)
    return Reply(status, reply_headers, rest)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return out


#: How each server is started: the example server on the official SDK as users run it
#: (``replaystore example-server``) and as a module, and its twin on FastMCP 4.
SERVERS = {
    "cli": ["-m", "replaystore", "example-server"],
    "module": ["-m", "replaystore.mcp.example"],
    "fastmcp": ["-m", "tests.mcp.fastmcp_app"],
}


def _spawn(kind: str, store_url: str, log_dir: Path) -> ServerProcess:
    port = find_free_port()
    log_path = log_dir / f"{kind}.log"
    args = [*SERVERS[kind], "--port", str(port), "--url", store_url, "--log-level", "warning"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    return ServerProcess(f"hostile-{kind}", port, proc, log_path, store_url)


@pytest.fixture(scope="module", params=sorted(SERVERS))
def target(
    request: pytest.FixtureRequest,
    mcp_redis: ServerHandle,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Target]:
    kind = request.param
    url = f"{mcp_redis.url}?prefix=hostile-{kind}:"
    server = _spawn(kind, url, tmp_path_factory.mktemp(f"hostile-{kind}"))
    try:
        wait_ready([server])
        yield Target(server)
    finally:
        server.stop()


def expect_verdict_or_refusal(reply: Reply) -> dict[str, Any] | None:
    """A bad cursor gets a 404 with a verdict (or a 400 from the HTTP layer), nothing else."""
    assert reply.status in (400, 404, 431), (reply.status, reply.body[:300])
    if reply.status == 404 and reply.headers.get("content-type", "").startswith("application/json"):
        data: dict[str, Any] = reply.json()["error"]["data"]
        assert data["verdict"] != "resumed"
        return data
    return None


# ------------------------------------------------------------- Last-Event-ID

_HEADER_BYTES = st.binary(max_size=200).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_CURSORISH = st.one_of(
    st.from_regex(r"\A[0-9a-f]{12}-[0-9]{1,40}\Z"),
    st.from_regex(r"\A[0-9a-f]{12}-[0-9]{1,20}\.[0-9a-f]{0,20}\.[0-9]{0,20}(\.[0-9]{0,20})?\Z"),
    st.from_regex(r"\A[0-9a-f]{0,14}-?-?[0-9]{0,25}\Z"),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)


@EXAMPLES
@given(
    value=st.one_of(
        _HEADER_BYTES,
        st.text(max_size=120).map(lambda t: t.replace("\r", "").replace("\n", "").encode()),
        _CURSORISH.map(str.encode),
        st.integers(min_value=1_000, max_value=60_000).map(lambda n: b"9" * n),
    )
)
def test_garbage_last_event_id_gets_a_verdict_never_a_500(target: Target, value: bytes) -> None:
    session = target.new_session()
    target.first_event_id(session)
    reply = target.request("GET", get_headers(session, value), stream_ok=True)
    if not value.strip(b" \t"):
        # An empty Last-Event-ID is no Last-Event-ID (the SSE rule): a plain GET stream.
        assert reply.status == 200, reply.body[:300]
        return
    if reply.status == 200:  # only a real cursor of this session may resume
        pytest.fail(f"resumed from {value[:80]!r}")
    expect_verdict_or_refusal(reply)


@EXAMPLES
@given(
    text=st.text(st.characters(min_codepoint=0xA0, max_codepoint=0x2FFF), min_size=1, max_size=40)
)
def test_a_utf8_last_event_id_is_reported_as_sent(target: Target, text: str) -> None:
    """The evidence names the cursor the client sent, not its bytes re-read as Latin-1."""
    session = target.new_session()
    reply = target.request("GET", get_headers(session, text.encode()), stream_ok=True)
    data = expect_verdict_or_refusal(reply)
    assert data is not None, (reply.status, reply.body[:200])
    assert data["verdict"] == "malformed_cursor"
    shown = data["evidence"]["cursor"]
    assert shown and text.startswith(shown), f"sent {text!r}, evidence says {shown!r}"


def test_a_valid_cursor_resumes(target: Target) -> None:
    """The control case: the same request with a real cursor is a 200 event stream."""
    session = target.new_session()
    cursor = target.first_event_id(session)
    reply = target.request("GET", get_headers(session, cursor.encode()), stream_ok=True)
    assert reply.status == 200, reply.body


# ------------------------------------------------------------ Mcp-Session-Id


@EXAMPLES
@given(
    value=st.one_of(
        _HEADER_BYTES.filter(bool),
        st.from_regex(r"\A[0-9a-f]{32}\Z").map(str.encode),
        st.integers(min_value=1_000, max_value=60_000).map(lambda n: b"s" * n),
    )
)
def test_unknown_or_garbage_session_ids_are_refused(target: Target, value: bytes) -> None:
    ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    headers = [h for h in base_headers() if h[0] != b"mcp-session-id"] + [
        (b"mcp-session-id", value)
    ]
    reply = target.request("POST", headers, ping)
    assert reply.status in (400, 404, 431), (reply.status, reply.body[:200])
    reply = target.request(
        "GET", [*get_headers("x", b"")[:2], (b"mcp-session-id", value)], stream_ok=True
    )
    assert reply.status in (400, 404, 431), (reply.status, reply.body[:200])
    reply = target.request("DELETE", headers)
    assert reply.status in (400, 404, 431), (reply.status, reply.body[:200])


def test_another_sessions_cursor_is_foreign_and_harms_only_the_presenter(target: Target) -> None:
    victim, attacker = target.new_session(), target.new_session()
    victim_cursor = target.first_event_id(victim)
    reply = target.request("GET", get_headers(attacker, victim_cursor.encode()), stream_ok=True)
    data = expect_verdict_or_refusal(reply)
    assert data is not None and data["verdict"] == "foreign_cursor"
    assert target.ping(victim) == 200  # the session whose cursor it was is untouched
    assert target.ping(attacker) == 404  # the presenter's session failed closed
    resumed = target.request("GET", get_headers(victim, victim_cursor.encode()), stream_ok=True)
    assert resumed.status == 200


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(id, data) of each event in an SSE body; data is "" for a priming event."""
    events = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n"):
        event_id, data, seen = None, [], False
        for line in block.split("\n"):
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "id":
                event_id, seen = value, True
            elif key == "data":
                data.append(value)
                seen = True
        if seen:
            events.append((event_id, "\n".join(data)))
    return events


def _hinted(event_id: str) -> Cursor:
    cursor = Cursor.parse(event_id)
    assert cursor.tag is not None, f"event ids carry a stream hint: {event_id}"
    return cursor


@EXAMPLES
@given(
    tag=st.from_regex(r"\A[0-9a-f]{16}\Z"),
    ordinal=st.integers(min_value=0, max_value=40),
    stamp=st.one_of(st.none(), st.integers(min_value=0, max_value=10**13)),
    borrow=st.booleans(),
)
def test_a_forged_cursor_hint_never_resumes_other_data(
    target: Target, tag: str, ordinal: int, stamp: int | None, borrow: bool
) -> None:
    """A cursor's position with another hint (random, or another stream's) resumes the
    position's own stream exactly, or fails closed; it never replays another stream."""
    session = target.new_session()
    one = sse_events(
        target.request("POST", base_headers(session), tool_call(1, 3, progress=True)).body
    )
    two = sse_events(
        target.request("POST", base_headers(session), tool_call(2, 3, progress=True)).body
    )
    assert one[0][0] is not None and two[0][0] is not None
    genuine = _hinted(one[0][0])
    expected = [data for _, data in one[1:] if data]  # what a resume from it must replay
    if borrow:  # the whole hint of the other stream's first event
        other = _hinted(two[0][0])
        forged = dataclasses.replace(
            genuine, tag=other.tag, ordinal=other.ordinal, stamp=other.stamp
        )
    else:  # a random hint, with the genuine stamp or a random one
        keep = genuine.stamp if stamp is None else stamp
        forged = dataclasses.replace(genuine, tag=tag, ordinal=ordinal, stamp=keep)
    if forged == genuine:
        return
    reply = target.request("GET", get_headers(session, str(forged).encode()))
    if reply.status == 200:
        replayed = [data for _, data in sse_events(reply.body) if data]
        assert replayed == expected, f"{forged} replayed {replayed[:3]}"
    else:
        expect_verdict_or_refusal(reply)


def test_a_genuine_cursor_replays_the_rest_of_its_stream(target: Target) -> None:
    """The control case of the forged hint: the real cursor replays its stream's rest."""
    session = target.new_session()
    one = sse_events(
        target.request("POST", base_headers(session), tool_call(1, 3, progress=True)).body
    )
    target.request("POST", base_headers(session), tool_call(2, 3, progress=True))
    genuine = one[0][0]
    assert genuine is not None
    reply = target.request("GET", get_headers(session, genuine.encode()))
    assert reply.status == 200, reply.body[:300]
    replayed = [data for _, data in sse_events(reply.body) if data]
    assert replayed == [data for _, data in one[1:] if data]
    assert len(replayed) == 4  # three progress notifications and the result


@pytest.mark.parametrize("order", ["victim-first", "presenter-first"])
def test_two_session_ids_in_one_request_act_on_at_most_one_session(
    target: Target, order: str
) -> None:
    """A request with two Mcp-Session-Id headers is refused, or judged against one
    session only: never checked against one session and applied to the other."""
    victim, presenter = target.new_session(), target.new_session()
    target.first_event_id(victim)
    target.first_event_id(presenter)
    ids = [victim, presenter] if order == "victim-first" else [presenter, victim]
    headers = [
        (b"accept", b"text/event-stream"),
        (b"mcp-protocol-version", PV.encode()),
        *((b"mcp-session-id", sid.encode()) for sid in ids),
        (b"last-event-id", b"garbage"),
    ]
    reply = target.request("GET", headers, stream_ok=True)
    data = expect_verdict_or_refusal(reply)
    alive = {sid: target.ping(sid) == 200 for sid in (victim, presenter)}
    if data is None:
        assert all(alive.values()), f"refused, yet a session ended: {alive}"
        return
    judged = data["evidence"]["session"]
    assert judged in ids
    assert alive == {sid: sid != judged for sid in (victim, presenter)}, (judged, alive)


# ------------------------------------------------------------ JSON-RPC ids

_JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=64),
)
_IDS = st.one_of(
    _JSON_LEAF,
    st.text(min_size=1, max_size=600),
    st.integers(min_value=250, max_value=3_000).map(lambda n: "i" * n),
    st.recursive(
        _JSON_LEAF,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=6,
    ),
)


@EXAMPLES
@given(request_id=_IDS)
def test_any_request_id_is_answered_and_the_session_kept(target: Target, request_id: Any) -> None:
    session = target.new_session()
    reply = target.request("POST", base_headers(session), tool_call(request_id))
    assert reply.status in (200, 202, 400, 413, 422), (reply.status, reply.body[:300])
    if reply.status == 200:
        messages = [
            json.loads(line[5:])
            for line in reply.body.decode().splitlines()
            if line.startswith("data:") and line[5:].strip()
        ]
        answers = [m for m in messages if "result" in m or "error" in m]
        assert answers, reply.body[:300]
        assert answers[-1]["id"] == request_id
    assert target.ping(session) == 200, "a bad request id must not end the session"


@pytest.mark.parametrize(("first", "second"), [(0, "0"), ("5", 5), (-3, "-3")])
def test_an_id_spelled_like_an_earlier_one_never_gets_its_answer(
    target: Target, first: Any, second: Any
) -> None:
    """0 and "0" are two JSON-RPC ids, but the SDK names both streams "0".

    The request sent second is refused with an error naming the reason (never
    answered with the earlier request's answer, never run as a copy), and the
    session stays; the earlier request sent again still gets its own answer.
    """
    session = target.new_session()
    if first != 0:  # the initialize (id 0) is the earlier request otherwise
        reply = target.request("POST", base_headers(session), tool_call(first))
        assert reply.status == 200, reply.body[:300]
    reply = target.request("POST", base_headers(session), tool_call(second))
    assert reply.status == 400, (reply.status, reply.body[:300])
    error = reply.json()["error"]
    assert error["code"] == -32600
    assert error["data"]["reason"] == "request_id_taken", error
    assert target.ping(session) == 200, "a refused request id must not end the session"
    if first != 0:
        again = target.request("POST", base_headers(session), tool_call(first))
        assert again.status == 200, again.body[:300]
        answers = [
            json.loads(line[5:])
            for line in again.body.decode().splitlines()
            if line.startswith("data:") and line[5:].strip()
        ]
        assert [m["id"] for m in answers if "result" in m or "error" in m] == [first]


def test_a_request_id_over_256_bytes_works(target: Target) -> None:
    """The SDK names a request's stream after its id; a long id must not break the stream."""
    session = target.new_session()
    request_id = "x" * 300
    reply = target.request("POST", base_headers(session), tool_call(request_id, 2))
    assert reply.status == 200, reply.body[:300]
    assert f'"id":"{request_id}"'.encode() in reply.body.replace(b" ", b"")
    assert target.ping(session) == 200


def test_a_two_megabyte_request_id_is_bounded(target: Target) -> None:
    session = target.new_session()
    reply = target.request("POST", base_headers(session), tool_call("y" * (2 << 20)))
    assert reply.status in (200, 400, 413), reply.body[:300]
    assert target.ping(session) == 200


# ------------------------------------------------------- other headers, methods

_HEADER_VALUE = st.one_of(
    _HEADER_BYTES,
    st.sampled_from(
        [b"", b"*/*", b"text/html", b"application/json", b"text/event-stream", b"2025-11-25",
         b"2099-01-01", b"2026-07-28", b"application/json; charset=latin-1"]
    ),
)  # fmt: skip


@EXAMPLES
@given(
    method=st.sampled_from(["POST", "GET", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]),
    accept=_HEADER_VALUE,
    content_type=_HEADER_VALUE,
    version=_HEADER_VALUE,
)
def test_odd_methods_and_headers_are_refused_cleanly(
    target: Target, method: str, accept: bytes, content_type: bytes, version: bytes
) -> None:
    session = target.new_session()
    headers = [
        (b"accept", accept),
        (b"content-type", content_type),
        (b"mcp-protocol-version", version),
        (b"mcp-session-id", session.encode()),
    ]
    ping = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "ping"}).encode()
    reply = target.request(method, headers, ping if method != "GET" else b"", stream_ok=True)
    assert reply.status < 500 or reply.status == 0, (reply.status, reply.body[:300])
    if method not in ("DELETE",):
        assert target.ping(session) == 200, f"{method} {headers} ended the session"


def test_an_oversized_request_head_is_refused_before_the_app_and_the_session_kept(
    target: Target,
) -> None:
    """A 200 KB header line gets a 4xx from the HTTP layer (not a large body), on either parser.

    h11 refuses it (400); uvicorn's httptools protocol alone would read any
    size and pass it on (a 20 MB header was served): the servers bound the head.
    """
    session = target.new_session()
    ping = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "ping"}).encode()
    padding = (b"x-padding", b"a" * 200_000)
    reply = target.request("POST", [*base_headers(session), padding], ping)
    assert reply.status in (400, 431), (reply.status, reply.body[:300])
    assert target.ping(session) == 200
    # A large body under a small head is no head to refuse.
    big = {"jsonrpc": "2.0", "id": 8, "method": "ping", "params": {"x": "y" * 300_000}}
    reply = target.request("POST", base_headers(session), json.dumps(big).encode())
    assert reply.status == 200, (reply.status, reply.body[:300])


def test_an_unknown_tool_with_a_two_megabyte_name_is_an_error_and_the_session_kept(
    target: Target,
) -> None:
    """The "Unknown tool" error echoes the name: an answer larger than ``max_payload``."""
    session = target.new_session()
    params = {"name": "n" * (2 << 20), "arguments": {}}
    body = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}
    reply = target.request("POST", base_headers(session), json.dumps(body).encode())
    assert reply.status in (200, 400, 413), reply.body[:300]
    if reply.status == 200:
        answers = [json.loads(data) for _, data in sse_events(reply.body) if data]
        assert answers and answers[-1]["id"] == 3
        assert "error" in answers[-1] or answers[-1]["result"].get("isError"), answers[-1]
    assert target.ping(session) == 200, "a large answer must not end the session"


# ------------------------------------------------------------------ bodies

_JUNK_BODIES = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    st.recursive(
        _JSON_LEAF,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=10,
    ).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {
            "jsonrpc": st.sampled_from(["2.0", "1.0", 2, None]),
            "id": _JSON_LEAF,
            "method": st.one_of(
                st.sampled_from(["tools/call", "ping", "initialize", "tools/list"]),
                st.text(max_size=30),
                _JSON_LEAF,
            ),
            "params": st.one_of(
                _JSON_LEAF,
                st.dictionaries(
                    st.sampled_from(["name", "arguments", "_meta"]), _JSON_LEAF, max_size=3
                ),
            ),
        },
    ).map(lambda v: json.dumps(v).encode()),
)


@EXAMPLES
@given(body=_JUNK_BODIES)
def test_junk_bodies_get_an_error_and_the_session_is_kept(target: Target, body: bytes) -> None:
    session = target.new_session()
    reply = target.request("POST", base_headers(session), body)
    assert reply.status in (200, 202, 400, 404, 406, 413, 415, 422), (
        reply.status,
        reply.body[:300],
    )
    assert target.ping(session) == 200, f"the session ended after {body[:100]!r}"


@pytest.mark.parametrize("size", [1 << 20, 4 << 20], ids=["1MiB", "4MiB"])
def test_huge_bodies_are_bounded(target: Target, size: int) -> None:
    session = target.new_session()
    body = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"pad": "p" * size}})
    reply = target.request("POST", base_headers(session), body.encode())
    assert reply.status in (200, 400, 413), reply.body[:300]
    assert target.ping(session) == 200

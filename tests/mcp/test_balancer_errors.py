"""Every error the shipped balancers answer themselves is a JSON-RPC error, not an HTML page.

Real nginx and HAProxy on ``deploy/nginx.conf`` and ``deploy/haproxy.cfg``
(started as ``tests/mcp/test_balancers.py`` starts them), in front of a
replica stand-in that passes the health check and closes every MCP request
unanswered: requests nginx cannot read, and one that no replica answers,
each get a JSON-RPC body a client can parse.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from replaystore.testing.servers import find_free_port
from tests.mcp._balancers import _ensure_balancers, _start_balancers

pytestmark = pytest.mark.realserver


@dataclass
class Balancers:
    nginx: int
    haproxy: int


class _Unanswering:
    """Answers ``/healthz`` with 200 and closes any other request unanswered."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", find_free_port()))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    head = conn.recv(65536)
                    if head.startswith(b"GET /healthz"):
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    # else: closed unanswered, as a replica that dies mid-request
                except OSError:
                    pass


@pytest.fixture(scope="module")
def balancers() -> Iterator[Balancers]:
    _ensure_balancers()
    upstream = _Unanswering()
    work = Path(tempfile.mkdtemp(prefix="replaystore-balancer-errors-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        nginx, haproxy, _ = _start_balancers(work, [upstream.port] * 3, procs)
        yield Balancers(nginx, haproxy)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(5)
        upstream.sock.close()
        shutil.rmtree(work, ignore_errors=True)


def _exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One raw request (nothing a client library would refuse to send): status, headers, body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or not _complete(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, body


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.decode("latin-1").lower().split("\r\n"):
        if line.startswith("content-length:"):
            return len(body) >= int(line.split(":")[1])
    return False


def _json_rpc_error(headers: dict[str, str], body: bytes) -> dict[str, object]:
    assert headers.get("content-type", "").startswith("application/json"), (headers, body)
    message = json.loads(body)
    assert message["jsonrpc"] == "2.0" and message["id"] is None, message
    error: dict[str, object] = message["error"]
    assert isinstance(error["code"], int) and error["message"], message
    return error


NGINX_ERRORS = {
    # A forged cursor far above any event id: nginx's 494, answered 431.
    "last_event_id_60kb": (
        b"GET /mcp HTTP/1.1\r\nHost: h\r\nAccept: text/event-stream\r\n"
        b"Last-Event-ID: " + b"7" * 60_000 + b"\r\n\r\n",
        431,
        "a header line is above 8 KiB",
    ),
    "malformed_request_line": (b"GARBAGE\r\n\r\n", 400, "could not parse"),
    "no_host": (b"GET /mcp HTTP/1.1\r\n\r\n", 400, "could not parse"),
    "uri_70kb": (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: h\r\n\r\n", 414, "URI Too Long"),
    "unknown_transfer_encoding": (
        b"POST /mcp HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n",
        501,
        "transfer encoding",
    ),
    "http_3_0": (b"GET /mcp HTTP/3.0\r\nHost: h\r\n\r\n", 505, "HTTP Version Not Supported"),
    "body_above_4mib": (
        b"POST /mcp HTTP/1.1\r\nHost: h\r\nContent-Length: 5000000\r\n\r\n",
        413,
        "above 4 MiB",
    ),
    # No replica answers: nginx's 502, answered as a replica's 503.
    "unanswered": (
        b"POST /mcp HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        503,
        "no server replica could answer",
    ),
}


@pytest.mark.parametrize("case", sorted(NGINX_ERRORS))
def test_nginx_answers_each_error_of_its_own_in_json(balancers: Balancers, case: str) -> None:
    request, status, says = NGINX_ERRORS[case]
    got, headers, body = _exchange(balancers.nginx, request)
    assert got == status, body[:300]
    assert says in str(_json_rpc_error(headers, body)["message"])
    if status == 503:
        assert headers.get("retry-after") == "1"


def test_haproxy_answers_a_request_no_replica_answered_in_json(balancers: Balancers) -> None:
    request = b"POST /mcp HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    status, headers, body = _exchange(balancers.haproxy, request)
    assert status == 502, body[:300]
    assert _json_rpc_error(headers, body)["code"] == -32603

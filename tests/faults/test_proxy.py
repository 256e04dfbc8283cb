"""The fault-injecting TCP proxy itself: routing, severing, lost replies, partitions.

Upstreams are tiny real TCP servers (each answers with its own name) and a real
Redis for the lost-reply case, so what the proxy does is observed on real
sockets, the way the fault tests and benchmarks rely on it.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
import redis

from replaystore.testing import TcpProxy, find_free_port
from tests.plugins.servers import RealServers

pytestmark = pytest.mark.realserver


class _Named(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: bytes) -> None:
        self.name = name
        super().__init__(("127.0.0.1", 0), _NameHandler)


class _NameHandler(socketserver.StreamRequestHandler):
    """Answers every line with ``<server name>:<line>``."""

    server: _Named

    def handle(self) -> None:
        for line in self.rfile:
            self.wfile.write(self.server.name + b":" + line)


@pytest.fixture
def named() -> Iterator[list[_Named]]:
    servers = [_Named(b"a"), _Named(b"b")]
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def _addr(server: _Named) -> tuple[str, int]:
    host, port = server.server_address[:2]
    return str(host), int(port)


def _connect(proxy: TcpProxy) -> socket.socket:
    sock = socket.create_connection(proxy.address, timeout=5)
    return sock


def _ask(sock: socket.socket, line: bytes) -> bytes:
    sock.sendall(line + b"\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1024)
        if not chunk:
            break
        data += chunk
    return data


def _closed(sock: socket.socket) -> bool:
    """True when the peer closed or reset the connection (no byte arrives)."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def test_round_robin_and_new_upstreams(named: list[_Named]) -> None:
    a, b = named
    with TcpProxy([_addr(a), _addr(b)]) as proxy:
        assert proxy.host == "127.0.0.1" and proxy.port > 0
        socks = [_connect(proxy) for _ in range(3)]
        assert [_ask(s, b"hi") for s in socks] == [b"a:hi\n", b"b:hi\n", b"a:hi\n"]
        assert proxy.accepted == 3
        assert proxy.open_connections == 3

        proxy.set_upstreams([_addr(b)])
        late = _connect(proxy)
        assert _ask(late, b"x") == b"b:x\n"
        # Open connections keep the server they were paired with.
        assert _ask(socks[0], b"again") == b"a:again\n"
        for sock in [*socks, late]:
            sock.close()


def test_sever_all_cuts_every_connection_and_keeps_serving(named: list[_Named]) -> None:
    with TcpProxy([_addr(named[0])]) as proxy:
        socks = [_connect(proxy) for _ in range(4)]
        for sock in socks:
            assert _ask(sock, b"up") == b"a:up\n"
        assert proxy.sever_all() == 4
        assert all(_closed(sock) for sock in socks)
        fresh = _connect(proxy)
        assert _ask(fresh, b"back") == b"a:back\n"
        for sock in [*socks, fresh]:
            sock.close()


def test_no_upstream_or_refused_upstream_closes_the_client(named: list[_Named]) -> None:
    with TcpProxy([]) as proxy:
        sock = _connect(proxy)
        assert _closed(sock)
        sock.close()
        proxy.set_upstreams([("127.0.0.1", find_free_port())])  # nothing listens there
        sock = _connect(proxy)
        assert _closed(sock)
        sock.close()


def test_pause_holds_bytes_and_new_connections_until_resume(named: list[_Named]) -> None:
    with TcpProxy([_addr(named[0])]) as proxy:
        early = _connect(proxy)
        assert _ask(early, b"1") == b"a:1\n"
        proxy.pause()
        early.sendall(b"2\n")
        late = _connect(proxy)  # the handshake completes; nothing else does
        late.sendall(b"3\n")
        for sock in (early, late):
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sock.recv(1024)
            sock.settimeout(5)
        proxy.resume()
        assert early.recv(1024) == b"a:2\n"
        assert late.recv(1024) == b"a:3\n"
        early.close()
        late.close()


def test_stop_closes_connections_and_the_port(named: list[_Named]) -> None:
    proxy = TcpProxy([_addr(named[0])]).start()
    sock = _connect(proxy)
    assert _ask(sock, b"x") == b"a:x\n"
    proxy.stop()
    assert _closed(sock)
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=2).close()
    proxy.stop()  # idempotent
    with pytest.raises(RuntimeError):
        proxy.sever_all()


def test_fixed_port_and_bad_needle(named: list[_Named]) -> None:
    port = find_free_port()
    with TcpProxy([_addr(named[0])], port=port) as proxy:
        assert proxy.port == port
        assert proxy.url() == f"redis://127.0.0.1:{port}/0"
        with pytest.raises(ValueError):
            proxy.drop_reply_after(b"")


def test_drop_reply_after_executes_the_request_and_loses_its_reply(
    real_servers: RealServers,
) -> None:
    server = real_servers.shared("redis")
    key = f"proxy-drop-{find_free_port()}"
    direct = redis.Redis.from_url(server.url)
    with TcpProxy([("127.0.0.1", server.ports[0])]) as proxy:
        sock = _connect(proxy)
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"
        proxy.drop_reply_after(key.encode())
        # The needle may straddle two writes: the proxy still finds it.
        command = f"*2\r\n$4\r\nINCR\r\n${len(key)}\r\n{key}\r\n".encode()
        cut = command.index(key.encode()) + 3
        sock.sendall(command[:cut])
        sock.sendall(command[cut:])
        assert _closed(sock), "no byte of the reply may reach the client"
        sock.close()
        assert proxy.wait_dropped(5)
        assert proxy.drops == 1
        assert direct.get(key) == b"1", "the request reached Redis and ran"

        # One shot: the next request with the same needle gets its reply.
        again = _connect(proxy)
        again.sendall(command)
        assert again.recv(64) == b":2\r\n"
        again.close()
        assert proxy.drops == 1
    direct.delete(key)
    direct.close()


def test_stall_reply_after_lets_part_of_one_reply_through_then_nothing(
    real_servers: RealServers,
) -> None:
    server = real_servers.shared("redis")
    key = f"proxy-stall-{find_free_port()}"
    with TcpProxy([("127.0.0.1", server.ports[0])]) as proxy:
        with pytest.raises(ValueError):
            proxy.stall_reply_after(b"x", -1)
        sock = _connect(proxy)
        proxy.stall_reply_after(key.encode(), keep=5)
        # MULTI, a queued command, EXEC: the server answers all at once.
        sock.sendall(
            b"*1\r\n$5\r\nMULTI\r\n"
            + f"*2\r\n$4\r\nINCR\r\n${len(key)}\r\n{key}\r\n".encode()
            + b"*1\r\n$4\r\nEXEC\r\n"
        )
        assert sock.recv(64) == b"+OK\r\n"
        assert proxy.wait_dropped(5)
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(64)  # silent, and still open
        sock.close()
        assert proxy.drops == 1
        # One shot: another connection gets whole replies.
        again = _connect(proxy)
        again.sendall(f"*2\r\n$4\r\nINCR\r\n${len(key)}\r\n{key}\r\n".encode())
        assert again.recv(64) == b":2\r\n"
        again.close()
    direct = redis.Redis.from_url(server.url)
    direct.delete(key)
    direct.close()

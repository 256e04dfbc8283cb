"""A loopback TCP proxy that breaks connections on purpose, for tests and benchmarks.

Faults that matter to a replay buffer happen on the wire: a reply lost after
the server executed a command, every connection cut at once, a partition
that leaves sockets open but silent. A mock client cannot show how the real
client library and the real server behave then; a real proxy in front of a
real server can.

The proxy runs its own asyncio event loop in a background thread, so
synchronous tests, asyncio tests and trio tests can all use it, and so that
a test's own event loop being busy never delays the fault. It needs nothing
beyond the standard library. Every public method is called from the test's
thread and returns once the proxy has acted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["TcpProxy"]

HOST = "127.0.0.1"
"""Loopback only: a test proxy must never be reachable from the network."""

_CHUNK = 65536
_CONNECT_TIMEOUT = 5.0
_T = TypeVar("_T")


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.dropping = False
        # Bytes of the reply still to forward before the link goes silent
        # (``stall_reply_after``); None: not stalling.
        self.stall: int | None = None
        self.closed = asyncio.Event()

    def abort(self) -> None:
        """Close both sides at once, discarding unsent bytes (a crash, not a goodbye)."""
        for writer in (self.client, self.server):
            if writer is not None:
                writer.transport.abort()
        self.closed.set()


class TcpProxy:
    """Forward loopback TCP connections to upstream servers, round-robin, with faults on demand.

    Each accepted client connection is paired with a new connection to the
    next upstream in turn. ``sever_all`` cuts every connection at once,
    ``drop_reply_after`` loses exactly one reply after the server received the
    request, ``stall_reply_after`` lets one reply stop halfway on an open
    connection, and ``pause``/``resume`` make the proxy a silent partition.
    """

    def __init__(self, upstreams: Sequence[tuple[str, int]], *, port: int = 0) -> None:
        self.host = HOST
        self.port = port
        self._upstreams = list(upstreams)
        self._turn = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._flowing: asyncio.Event | None = None
        self._needle: bytes | None = None
        self._keep: int | None = None  # armed as a stall (bytes to let through), not a drop
        self._dropped = threading.Event()
        self._drops = 0
        self._accepted = 0
        self._lock = threading.Lock()

    # -- life cycle --------------------------------------------------------

    def start(self) -> TcpProxy:
        """Bind and start serving; the port accepts connections when this returns."""
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"TcpProxy:{self.port}", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self._call(self._listen())
        except BaseException:
            self._shutdown_loop()
            raise
        return self

    def stop(self) -> None:
        """Stop listening, close every connection and join the thread; idempotent."""
        if self._loop is None:
            return
        with contextlib.suppress(RuntimeError):
            self._call(self._close())
        self._shutdown_loop()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def url(self, scheme: str = "redis", path: str = "/0") -> str:
        """``redis://127.0.0.1:PORT/0``: the URL that reaches the upstreams through the proxy."""
        return f"{scheme}://{self.host}:{self.port}{path}"

    # -- routing -----------------------------------------------------------

    def set_upstreams(self, upstreams: Sequence[tuple[str, int]]) -> None:
        """Route new connections to these servers; open connections keep their server.

        An empty list makes the proxy accept and close at once (a refused
        service with an open port).
        """
        with self._lock:
            self._upstreams = list(upstreams)

    # -- faults ------------------------------------------------------------

    def sever_all(self) -> int:
        """Cut every open connection at once, both sides; returns how many were cut."""
        return self._call(self._sever())

    def drop_reply_after(self, needle: bytes) -> None:
        """Lose the reply to the next request that contains ``needle`` (one shot).

        The chunk containing ``needle`` reaches the server; the proxy then
        waits for the first byte of the reply (proof that the server executed
        the request), discards it and cuts both sides, so the client sees its
        connection drop with the request executed and no answer. If no reply
        comes within five seconds the connection is cut anyway.
        """
        if not needle:
            raise ValueError("needle must not be empty")
        self._dropped.clear()
        self._call(self._arm(needle))

    def stall_reply_after(self, needle: bytes, keep: int) -> None:
        """Let only the first ``keep`` bytes of the next reply through (one shot).

        The reply to the next request containing ``needle`` stops after
        ``keep`` bytes and that connection then stays open and silent: a
        server that stops halfway through a reply. The client must give up by
        its own timeout.
        """
        if not needle or keep < 0:
            raise ValueError("needle must not be empty and keep must be >= 0")
        self._dropped.clear()
        self._call(self._arm(needle, keep))

    def wait_dropped(self, timeout: float = 5.0) -> bool:
        """True once the armed ``drop_reply_after`` (or ``stall_reply_after``) fault has fired."""
        return self._dropped.wait(timeout)

    @property
    def drops(self) -> int:
        """How many replies ``drop_reply_after`` discarded or ``stall_reply_after`` cut short."""
        return self._drops

    @property
    def accepted(self) -> int:
        """How many client connections the proxy has accepted so far."""
        return self._accepted

    @property
    def open_connections(self) -> int:
        """How many client connections are open right now."""
        return self._call(self._count())

    def pause(self) -> None:
        """Partition: keep every socket open but forward nothing, and leave new connections hanging.

        Bytes read meanwhile are held and delivered on ``resume``, as TCP
        would after a partition heals before its timeouts.
        """
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        """End a ``pause``: forward held bytes and connect waiting clients."""
        self._call(self._set_flowing(True))

    # -- inside the loop thread ----------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        loop = self._loop
        if loop is None or not loop.is_running():
            coro.close()
            raise RuntimeError("proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    def _shutdown_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = None
        self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=10)
        if loop is not None and not loop.is_running():
            loop.close()

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self._server = await asyncio.start_server(self._accept, sock=sock, backlog=1024)
        self.port = sock.getsockname()[1]

    async def _close(self) -> None:
        """End every connection handler without cancelling it (asyncio logs cancelled ones)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        if self._flowing is not None:
            self._flowing.set()  # paused handlers wake up, see the proxy closing and return
        await self._sever()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5)
        stragglers = [task for task in (*self._handlers, *self._tasks) if not task.done()]
        for task in stragglers:
            task.cancel()
        await asyncio.gather(*stragglers, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _sever(self) -> int:
        links = list(self._links)
        for link in links:
            link.abort()
        return len(links)

    async def _arm(self, needle: bytes, keep: int | None = None) -> None:
        self._needle = needle
        self._keep = keep

    async def _count(self) -> int:
        return len(self._links)

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accepted += 1
        link = _Link(writer)
        self._links.add(link)
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            await self._serve(link, reader)
        except Exception:  # a broken link ends quietly, as on a real network
            pass
        finally:
            link.abort()
            self._links.discard(link)
            if task is not None:
                self._handlers.discard(task)

    async def _serve(self, link: _Link, client_reader: asyncio.StreamReader) -> None:
        assert self._flowing is not None
        await self._flowing.wait()
        with self._lock:
            upstreams = self._upstreams
            target = upstreams[next(self._turn) % len(upstreams)] if upstreams else None
        if target is None or self._closing or link.closed.is_set():
            return
        try:
            server_reader, link.server = await asyncio.wait_for(
                asyncio.open_connection(*target), _CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            return
        upward = self._spawn(self._pump_up(link, client_reader))
        downward = self._spawn(self._pump_down(link, server_reader))
        closed = self._spawn(self._wait_closed(link))
        await asyncio.wait({upward, downward, closed}, return_when=asyncio.FIRST_COMPLETED)
        link.abort()
        for task in (upward, downward, closed):
            task.cancel()
        await asyncio.gather(upward, downward, closed, return_exceptions=True)

    @staticmethod
    async def _wait_closed(link: _Link) -> None:
        await link.closed.wait()

    async def _pump_up(self, link: _Link, reader: asyncio.StreamReader) -> None:
        """Client to server; arms the lost-reply fault on the chunk carrying the needle."""
        assert self._flowing is not None
        assert link.server is not None
        tail = b""
        while True:
            chunk = await reader.read(_CHUNK)
            if not chunk:
                return
            await self._flowing.wait()
            needle = self._needle
            if needle is not None and needle in tail + chunk:
                self._needle = None
                if self._keep is not None:
                    link.stall = self._keep
                else:
                    link.dropping = True
                    asyncio.get_running_loop().call_later(5.0, self._drop, link)
            elif needle is not None:
                tail = (tail + chunk)[-(len(needle) - 1) :] if len(needle) > 1 else b""
            link.server.write(chunk)
            await link.server.drain()

    async def _pump_down(self, link: _Link, reader: asyncio.StreamReader) -> None:
        """Server to client; the first reply byte after an armed request ends the link instead."""
        assert self._flowing is not None
        while True:
            chunk = await reader.read(_CHUNK)
            if not chunk:
                return
            if link.dropping:
                self._drop(link)
                return
            if link.stall is not None:
                part = chunk[: link.stall]
                if part:
                    link.stall -= len(part)
                    link.client.write(part)
                    await link.client.drain()
                if link.stall == 0 and not self._dropped.is_set():
                    self._drops += 1
                    self._dropped.set()
                continue  # the rest is never forwarded: the link stays open and silent
            await self._flowing.wait()
            if link.dropping:
                self._drop(link)
                return
            link.client.write(chunk)
            await link.client.drain()

    def _drop(self, link: _Link) -> None:
        if link.closed.is_set():
            return
        link.abort()
        self._drops += 1
        self._dropped.set()

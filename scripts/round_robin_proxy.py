"""A loopback HTTP/1.1 proxy: each request to the next replica, on a new connection.

A balancer that keeps connections to its upstreams sends a client's
requests to the replica its connection happens to reach; this one sends
every request to the next replica in turn, on a connection of its own, so
that a multi-request exchange (a multi-round call, a task polled with
``tasks/get``, a session's requests) meets every replica. The answer is
streamed back as it comes (SSE included) and the client's connection is
closed after it. Standard library only.

With ``--cut-bytes N`` every answer is cut after a random number of bytes
(1 to N, headers included): the client's connection is aborted there, in
the middle of a header, an event or a line, as a flaky network or a dying
balancer would. A client that resumes has to do it on every answer.

    python scripts/round_robin_proxy.py --port 8080 --upstream 127.0.0.1:3001 --upstream ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import signal
import socket
import struct

_CHUNK = 65536
_HEAD_LIMIT = 1 << 16


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes:
    """The request's body exactly as sent (Content-Length, or chunked, or none)."""
    fields = {name.lower(): value for name, value in headers}
    if "chunked" in fields.get("transfer-encoding", "").lower():
        raw = bytearray()
        while True:
            line = await reader.readline()
            raw += line
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    trailer = await reader.readline()
                    raw += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return bytes(raw)
            raw += await reader.readexactly(size + 2)
    length = int(fields.get("content-length", "0") or 0)
    return await reader.readexactly(length) if length else b""


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int | None = None
) -> bool:
    """Forward until the end, or abort ``writer`` after ``limit`` bytes; True if cut."""
    sent = 0
    while chunk := await reader.read(_CHUNK):
        if limit is not None and sent + len(chunk) >= limit:
            writer.write(chunk[: limit - sent])
            await writer.drain()
            _abort(writer)
            return True
        sent += len(chunk)
        writer.write(chunk)
        await writer.drain()
    return False


def _abort(writer: asyncio.StreamWriter) -> None:
    """Reset the connection (RST), as a crash or a broken network does, not a clean close."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    def __init__(self, upstreams: list[tuple[str, int]], cut_bytes: int | None = None) -> None:
        self._next = itertools.cycle(upstreams)
        self.served: dict[str, int] = {f"{h}:{p}": 0 for h, p in upstreams}
        self.cut_bytes = cut_bytes
        self.cuts = 0

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_w: asyncio.StreamWriter | None = None
        try:
            head = await client_r.readuntil(b"\r\n\r\n")
            if len(head) > _HEAD_LIMIT:
                return
            lines = head.decode("latin-1").split("\r\n")
            request_line, raw_headers = lines[0], [line for line in lines[1:] if line]
            headers = [
                (n.strip(), v.strip()) for n, _, v in (h.partition(":") for h in raw_headers)
            ]
            body = await _read_body(client_r, headers)
            kept = [(n, v) for n, v in headers if n.lower() not in ("connection", "keep-alive")]
            out = "\r\n".join([request_line, *(f"{n}: {v}" for n, v in kept), "Connection: close"])
            host, port = next(self._next)
            self.served[f"{host}:{port}"] += 1
            upstream_r, upstream_w = await asyncio.open_connection(host, port)
            upstream_w.write(out.encode("latin-1") + b"\r\n\r\n" + body)
            await upstream_w.drain()
            limit = random.randint(1, self.cut_bytes) if self.cut_bytes else None
            down = asyncio.create_task(_pipe(upstream_r, client_w, limit))
            # The client hanging up (a cancelled stream) ends the exchange upstream too.
            gone = asyncio.create_task(client_r.read(1))
            await asyncio.wait({down, gone}, return_when=asyncio.FIRST_COMPLETED)
            if down.done() and not down.cancelled() and down.exception() is None and down.result():
                self.cuts += 1
            for task in (down, gone):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            for writer in (upstream_w, client_w):
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()


async def serve(port: int, upstreams: list[tuple[str, int]], cut_bytes: int | None) -> None:
    proxy = Proxy(upstreams, cut_bytes)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", port, limit=_HEAD_LIMIT)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    # The evidence that every replica took its share, in the proxy's log.
    print("requests per upstream:", json.dumps(proxy.served), flush=True)
    if cut_bytes:
        print("answers cut:", proxy.cuts, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", action="append", required=True, help="HOST:PORT")
    parser.add_argument(
        "--cut-bytes",
        type=int,
        default=None,
        metavar="N",
        help="cut every answer after a random number of bytes, 1 to N",
    )
    args = parser.parse_args()
    if args.cut_bytes is not None and args.cut_bytes < 1:
        parser.error("--cut-bytes must be at least 1")
    upstreams = [(h, int(p)) for h, _, p in (u.rpartition(":") for u in args.upstream)]
    asyncio.run(serve(args.port, upstreams, args.cut_bytes))


if __name__ == "__main__":
    main()

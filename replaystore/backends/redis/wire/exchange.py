"""One exchange on one connection: a packet written, its replies read back under one timer.

The replies are read as Redis sent them: fed from the socket to the
connection's hiredis reader and taken from it (redis-py's own parser when
hiredis is not installed), error replies kept as values. A connection that
fails or falls out of step is dropped here, with what it still holds to send.
Everything here works on redis-py's own connection classes, through the names
:mod:`..redispy` lists and checks.
"""

from __future__ import annotations

import asyncio
import math
import types
from asyncio import StreamReader
from collections.abc import Generator
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .... import deadlines
from ..redispy import HIREDIS_PARSER, NOT_ENOUGH_DATA

try:
    import hiredis as _hiredis
except ImportError:  # redis-py parses in Python, and replies are read through it
    _hiredis = None  # type: ignore[assignment]
#: A RESP3 push message's type (hiredis 3.2 on); before, pushes come as plain lists.
_PUSH: Any = getattr(_hiredis, "PushNotification", None)
#: Beside plain lists, the replies :func:`_read_hiredis` looks at more closely: a push
#: message (a list of a class of its own) and a connection error Redis reports.
_SPECIAL: tuple[type, ...] = (list, RedisConnectionError)

__all__ = ["Deadlines", "drop", "exchange", "sound"]


def sound(conn: Any) -> bool:
    """A kept connection that is open, not closed by the server, and not due for a reconnect."""
    reader: StreamReader | None = conn._reader
    return (
        reader is not None
        and conn.is_connected
        and not reader.at_eof()
        and reader.exception() is None
        and not conn.should_reconnect()
    )


class Deadlines(deadlines.Deadlines[StreamReader]):
    """The deadlines of one wire's exchanges (:mod:`replaystore.deadlines`): at its deadline a
    connection's reader gets a timeout as its exception, which wakes the read waiting on it,
    or fails the next one."""

    def __init__(self) -> None:
        super().__init__(_expire)


async def exchange(
    conn: Any, packet: bytes, replies: int, slack: float, *, crowded: bool, deadlines: Deadlines
) -> list[Any]:
    """Send a packet and read its replies, error replies as values, under one timer.

    The timer (kept by ``deadlines``, the wire's) sets, at the socket timeout
    (plus ``slack``), a timeout as the exception of the connection's reader,
    which wakes the read waiting on it, or fails the next one. (A connection
    that times out is dropped, so nothing reads it again.) Wrapping the reads
    in ``asyncio.timeout`` instead costs a context manager, a
    task-cancellation round and a reschedule per call.

    The common cases of :func:`_send` (an open connection, alone, the socket
    takes the packet at once) and of :func:`_read_hiredis` (every reply a
    plain one) run here inline: each coroutine a resume goes through costs
    it a frame on every step, and this is every call's path.
    """
    writer = conn._writer
    if crowded or writer is None or not conn.is_connected:
        await _send(conn, packet, crowded=crowded)
    else:
        try:
            writer.write(packet)
            waits = writer.transport.get_write_buffer_size()
        except OSError as exc:
            raise RedisConnectionError(f"error while writing to socket: {exc}") from exc
        if waits:
            await _drain(conn, writer)
        else:
            await _pass()  # see _send: the reply takes longer than one loop iteration
    reader: StreamReader = conn._reader
    timeout = conn.socket_timeout
    if timeout is not None:
        deadlines.start(reader, timeout + slack)
    try:
        parser = conn._parser
        if type(parser) is not HIREDIS_PARSER:
            return [await _reply(conn) for _ in range(replies)]
        hiredis = parser._reader
        gets = hiredis.gets
        out: list[Any] = []
        while len(out) < replies:
            reply = gets()
            if reply is NOT_ENOUGH_DATA:
                data = await reader.read(_READ_SIZE)
                if not data:
                    raise RedisConnectionError("Connection closed by server.")
                hiredis.feed(data)
                continue
            if type(reply) is list:  # the common case: checked here as _read_hiredis would
                if reply and isinstance(reply[0], RedisConnectionError):
                    raise reply[0]
            elif isinstance(reply, _SPECIAL):  # a push message, a connection error reply
                return await _read_hiredis(parser, reader, replies, out, reply)
            out.append(reply)
        return out
    except OSError as exc:  # a socket error the reader raised
        if isinstance(exc, TimeoutError):
            raise RedisTimeoutError("timeout reading pipelined replies") from exc
        raise RedisConnectionError(f"error while reading from socket: {exc}") from exc
    finally:
        if timeout is not None:
            deadlines.stop(reader)


@types.coroutine
def _pass() -> Generator[None, None, None]:
    """Let the event loop run one iteration (what ``asyncio.sleep(0)`` does, one frame less)."""
    yield


async def _drain(conn: Any, writer: Any) -> None:
    """Wait, under the socket timeout, until the socket took a packet it could not take at once."""
    try:
        await asyncio.wait_for(writer.drain(), conn.socket_timeout)
    except TimeoutError:
        raise RedisTimeoutError("timeout writing to socket") from None
    except OSError as exc:
        raise RedisConnectionError(f"error while writing to socket: {exc}") from exc


def _expire(reader: StreamReader) -> None:
    if reader.exception() is None:
        reader.set_exception(RedisTimeoutError("timeout reading pipelined replies"))


_READ_SIZE = 65536


async def _read_hiredis(
    parser: Any, reader: StreamReader, replies: int, out: list[Any], reply: Any
) -> list[Any]:
    """The rest of ``replies`` replies, from ``reply`` (just taken from the parser's hiredis
    reader) on, after :func:`exchange` met one that is not a plain reply.

    What redis-py's hiredis parser does per reply, once per packet: an error
    reply is a value (``ResponseError``), a connection error Redis reports
    (``LOADING`` ...) is raised, and a RESP3 push message read in between goes
    to redis-py's own handler, not into the replies.
    """
    gets = parser._reader.gets
    feed = parser._reader.feed
    while True:
        if reply is NOT_ENOUGH_DATA:
            data = await reader.read(_READ_SIZE)
            if not data:
                raise RedisConnectionError("Connection closed by server.")
            feed(data)
        elif _PUSH is not None and isinstance(reply, _PUSH):
            await parser.handle_push_response(reply)
        elif isinstance(reply, RedisConnectionError):
            raise reply
        elif isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError):
            raise reply[0]
        else:
            out.append(reply)
            if len(out) >= replies:
                return out
        reply = gets()


async def _reply(conn: Any) -> Any:
    """One reply through redis-py's parser (not hiredis), with no timer of its own (the caller's
    covers it); an error reply as a value. (After an error reply the connection is in step.)
    """
    try:
        return await conn.read_response(timeout=math.inf)
    except ResponseError as exc:
        return exc


async def _send(conn: Any, packet: bytes, *, crowded: bool) -> None:
    """Write a packet on a connection of redis-py's own classes.

    redis-py's ``send_packed_command`` runs every write under
    ``asyncio.wait_for``, which on Python 3.11 creates a task per call: more
    client time than a short resume's own work. A packet the socket takes at
    once needs no timer, so only a write that has to wait (the socket's buffer
    is full) is timed, under the socket timeout as redis-py would. A connection
    not yet open goes through redis-py, which opens it.

    When the write happens is chosen for Redis's sake as much as ours:

    * alone, the write goes out at once and the task then yields to the event
      loop once: the reply takes longer than one loop iteration, and a read
      started at once would find nothing, put the loop to sleep and make the
      reply wake it, which costs both sides more than the yield;
    * ``crowded`` (other calls of this backend in flight), the task yields
      first, so that the writes of all the calls that are ready go out
      together in the next loop iteration and Redis reads them in one wake-up
      instead of one each. (:mod:`.batching` goes further: it gathers the
      ready calls into one packet before they get here.)

    (Figures: ``docs/benchmarks.md``, "The wire's choices".)
    """
    writer = getattr(conn, "_writer", None)
    if writer is None or not conn.is_connected:
        await conn.send_packed_command(packet, check_health=False)
        return
    try:
        if crowded:
            await _pass()
        writer.write(packet)
        if writer.transport.get_write_buffer_size():
            await asyncio.wait_for(writer.drain(), conn.socket_timeout)
        elif not crowded:
            await _pass()
    except TimeoutError:
        raise RedisTimeoutError("timeout writing to socket") from None
    except OSError as exc:
        raise RedisConnectionError(f"error while writing to socket: {exc}") from exc


async def drop(conn: Any) -> None:
    """Drop a connection that failed or is out of step, and what it still holds to send.

    A plain close would still send the rest of a packet whose write timed
    out, and Redis would run the command after the caller was told it
    failed; cut off, the command never completes and is never run.
    """
    writer = getattr(conn, "_writer", None)
    if writer is not None:
        writer.transport.abort()
    await conn.disconnect(nowait=True)

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
from asyncio import StreamReader
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..redispy import HIREDIS_PARSER, NOT_ENOUGH_DATA

try:
    import hiredis as _hiredis
except ImportError:  # redis-py parses in Python, and replies are read through it
    _hiredis = None  # type: ignore[assignment]
#: A RESP3 push message's type (hiredis 3.2 on); before, pushes come as plain lists.
_PUSH: Any = getattr(_hiredis, "PushNotification", None)

__all__ = ["drop", "exchange", "sound"]


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


async def exchange(
    conn: Any, packet: bytes, replies: int, slack: float, *, crowded: bool
) -> list[Any]:
    """Send a packet and read its replies, error replies as values, under one timer.

    The timer is one event-loop callback for the whole exchange: at the socket
    timeout (plus ``slack``) it sets a timeout as the exception of the
    connection's reader, which wakes the read waiting on it, or fails the next
    one. (A connection that times out is dropped, so nothing reads it again.)
    Wrapping the reads in ``asyncio.timeout`` instead costs a context manager,
    a task-cancellation round and a reschedule per call.
    """
    await _send(conn, packet, crowded=crowded)
    reader: StreamReader = conn._reader
    timeout = conn.socket_timeout
    timer = None
    if timeout is not None:
        loop = asyncio.get_running_loop()
        timer = loop.call_at(loop.time() + timeout + slack, _expire, reader)
    try:
        if type(conn._parser) is HIREDIS_PARSER:
            return await _read_hiredis(conn._parser, reader, replies)
        return [await _reply(conn) for _ in range(replies)]
    except OSError as exc:  # a socket error the reader raised
        if isinstance(exc, TimeoutError):
            raise RedisTimeoutError("timeout reading pipelined replies") from exc
        raise RedisConnectionError(f"error while reading from socket: {exc}") from exc
    finally:
        if timer is not None:
            timer.cancel()


def _expire(reader: StreamReader) -> None:
    if reader.exception() is None:
        reader.set_exception(RedisTimeoutError("timeout reading pipelined replies"))


_READ_SIZE = 65536


async def _read_hiredis(parser: Any, reader: StreamReader, replies: int) -> list[Any]:
    """``replies`` replies fed from the socket to the parser's hiredis reader and taken from it.

    What redis-py's hiredis parser does per reply, once per packet: an error
    reply is a value (``ResponseError``), a connection error Redis reports
    (``LOADING`` ...) is raised, and a RESP3 push message read in between goes
    to redis-py's own handler, not into the replies.
    """
    gets = parser._reader.gets
    feed = parser._reader.feed
    out: list[Any] = []
    while len(out) < replies:
        reply = gets()
        if reply is NOT_ENOUGH_DATA:
            data = await reader.read(_READ_SIZE)
            if not data:
                raise RedisConnectionError("Connection closed by server.")
            feed(data)
            continue
        if _PUSH is not None and isinstance(reply, _PUSH):
            await parser.handle_push_response(reply)
            continue
        if isinstance(reply, RedisConnectionError):
            raise reply
        if isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError):
            raise reply[0]
        out.append(reply)
    return out


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
            await asyncio.sleep(0)
        writer.write(packet)
        if writer.transport.get_write_buffer_size():
            await asyncio.wait_for(writer.drain(), conn.socket_timeout)
        elif not crowded:
            await asyncio.sleep(0)
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

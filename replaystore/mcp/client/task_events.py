"""A task's events (``tasks/stream``), each once and in order, through any number of reconnects.

A server with the tasks extension's ``eventStreams`` capability answers
``tasks/stream {taskId, after?}`` with the task's events as
``notifications/tasks/event`` messages on the request's response (``seq``
per task from 0, one more each time), retained ones first, then live ones;
``after`` is exclusive. The response's result ``{}`` says the task is
terminal and every event was sent. That response can break anywhere: a
replica drains or dies, a balancer cuts the connection, the store stalls
(``503``). :class:`TaskEventStream` keeps the ``seq`` of the last event it
handed over and sends ``tasks/stream`` again with ``after`` set to it, to any
replica, until the result comes::

    async with TaskClient(url) as client:
        async for event in client.stream_events(task_id):
            print(event.seq, event.type, event.payload)

What it promises the application:

- each ``seq`` once (an event sent again after a reconnect is dropped) and
  in order: an event that skips a ``seq`` the server did not say was gone
  raises :class:`TaskStreamError`, it is never passed over in silence;
- a response that ends without a result is a broken stream, never the end:
  only ``{}`` ends the iteration;
- events the server no longer keeps raise :class:`EventsGoneError` with the
  earliest ``seq`` still kept; with ``on_gone="earliest"`` the stream goes
  on from there instead, and :attr:`TaskEventStream.lost` says which
  ``seq`` ranges were never seen.

Failures ride the :class:`~replaystore.mcp.client.TaskClient`'s retry
settings: a reconnect waits ``backoff`` seconds, doubling up to
``max_backoff`` (longer when a ``Retry-After`` asks, up to ``max_backoff``),
and after ``retry_for`` seconds without a single new event the stream raises
:class:`~replaystore.mcp.client.TaskUnavailableError`. A response silent for
``idle_timeout`` seconds is opened again at once (a replica that stopped
answering looks the same as a quiet task).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import httpx2

from ...taskstore.sep2694 import EVENT_NOTIFICATION as EVENT
from ...taskstore.sep2694 import EVENTS_GONE, EVENTS_GONE_CODE
from ...taskstore.sep2694 import STREAM_METHOD as STREAM
from ...testing.sse import sse_events
from .answers import (
    RETRY_STATUSES,
    TaskError,
    TaskRequestError,
    TaskUnavailableError,
    response_message,
    retry_after,
    transient,
)
from .closing import Closing

__all__ = ["EventsGoneError", "TaskEvent", "TaskEventStream", "TaskRequests", "TaskStreamError"]

OnGone = Literal["raise", "earliest"]


class TaskRequests(Protocol):
    """What a stream reads through: a :class:`~replaystore.mcp.client.TaskClient`.

    Its URL and HTTP client, how it sends a request again (``backoff``
    doubling up to ``max_backoff``, for ``retry_for`` seconds), and the
    envelope of one request.
    """

    url: str
    retry_for: float
    backoff: float
    max_backoff: float

    @property
    def http(self) -> httpx2.AsyncClient: ...

    def envelope(
        self, request_id: str, method: str, params: Mapping[str, Any], name: str
    ) -> tuple[dict[str, Any], dict[str, str]]: ...


@dataclass(frozen=True)
class TaskEvent:
    """One event of a task, as the server sent it."""

    task_id: str
    seq: int
    type: str
    payload: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


class EventsGoneError(TaskRequestError):
    """Events after the cursor are no longer kept; ``earliest_seq`` is the oldest one still kept.

    ``after`` is the cursor that was asked for (None: from the start). Stream
    again with ``after=earliest_seq - 1`` (or ``on_gone="earliest"``) to go on
    with what is left, knowing events ``after + 1 .. earliest_seq - 1`` are lost.
    """

    def __init__(self, error: Mapping[str, Any], task_id: str, after: int | None) -> None:
        data = error.get("data") or {}
        self.task_id = task_id
        self.after = after
        self.earliest_seq = int(data["earliestSeq"])
        super().__init__(STREAM, error)


class TaskStreamError(TaskError):
    """The server broke the stream's rules: a skipped ``seq``, another task's event, bad fields.

    Raised rather than passed over: the application would otherwise miss an
    event without knowing it.
    """


class TaskEventStream(Closing):
    """The events of one task, from ``after`` (exclusive; None: the earliest kept) to its end.

    Iterate it once (``async for``); leave it early with ``async with`` or
    :meth:`aclose` so that the open response is closed. :attr:`last_seq` is
    the cursor to resume from later (persist it with each handled event).
    """

    def __init__(
        self,
        client: TaskRequests,
        task_id: str,
        *,
        after: int | None = None,
        on_gone: OnGone = "raise",
        idle_timeout: float = 30.0,
        close_client: bool = False,
    ) -> None:
        """``close_client``: the client's HTTP connections are the stream's, closed at its end."""
        if after is not None and (isinstance(after, bool) or after < 0):
            raise ValueError("after must be a non-negative integer or None")
        if on_gone not in ("raise", "earliest"):
            raise ValueError('on_gone must be "raise" or "earliest"')
        if idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        self.client = client
        self.task_id = task_id
        self.on_gone = on_gone
        self.idle_timeout = idle_timeout
        #: The ``seq`` of the last event handed over (or the cursor given): resume after it.
        self.last_seq: int | None = after
        #: Responses opened (the first one and every reconnect).
        self.requests = 0
        #: Events received again after a reconnect, and dropped.
        self.duplicates = 0
        #: ``(first, last)`` seq ranges skipped with ``on_gone="earliest"``.
        self.lost: list[tuple[int, int]] = []
        #: True once the server ended the stream with its result ``{}``.
        self.completed = False
        self._iterator: AsyncIterator[TaskEvent] | None = None
        self._close_client = close_client

    def __aiter__(self) -> AsyncIterator[TaskEvent]:
        if self._iterator is None:
            self._iterator = self._events()
        return self._iterator

    async def aclose(self) -> None:
        """Stop reading: close the open response (the task goes on)."""
        iterator = self._iterator
        if iterator is not None and hasattr(iterator, "aclose"):
            await iterator.aclose()  # its end closes the client if it is the stream's
        elif self._close_client:
            await self.client.http.aclose()

    async def _events(self) -> AsyncIterator[TaskEvent]:
        try:
            async for event in self._resuming():
                yield event
        finally:
            if self._close_client:
                await self.client.http.aclose()

    async def _resuming(self) -> AsyncIterator[TaskEvent]:
        client = self.client
        pause = client.backoff
        deadline = anyio.current_time() + client.retry_for
        timeout = httpx2.Timeout(30.0, read=self.idle_timeout)
        while True:
            request_id = uuid.uuid4().hex
            params: dict[str, Any] = {"taskId": self.task_id}
            if self.last_seq is not None:
                params["after"] = self.last_seq
            body, headers = client.envelope(request_id, STREAM, params, self.task_id)
            self.requests += 1
            wait: float | None = None
            streaming = False  # the server answered with an event stream
            try:
                async with client.http.stream(
                    "POST", client.url, json=body, headers=headers, timeout=timeout
                ) as response:
                    status = response.status_code
                    content_type = response.headers.get("content-type", "")
                    wait = retry_after(response.headers.get("retry-after"))
                    if status == 200 and "text/event-stream" in content_type:
                        streaming = True
                        answer: dict[str, Any] | None = None
                        async for sse in sse_events(response):
                            message = _json(sse.data)
                            if message is None:
                                continue
                            if message.get("method") == EVENT:
                                event = self._accept(message.get("params"))
                                if event is not None:
                                    pause = client.backoff
                                    deadline = anyio.current_time() + client.retry_for
                                    yield event
                            elif message.get("id") == request_id:
                                answer = message
                                break
                    else:
                        text = (await response.aread()).decode(errors="replace")
                        answer = response_message(text, content_type, request_id)
            except httpx2.TransportError as exc:  # refused, reset, cut mid-stream, silent
                failure: dict[str, Any] = {"code": None, "message": f"{type(exc).__name__}: {exc}"}
                if streaming and isinstance(exc, httpx2.ReadTimeout):
                    # A stream silent for idle_timeout: a quiet task, or a replica that
                    # stopped answering mid-stream. Open it again at once; not a failure.
                    deadline = anyio.current_time() + client.retry_for
                    continue
            else:
                if answer is not None and "error" not in answer:
                    self.completed = True  # the result: terminal, every event sent
                    return
                if answer is not None:
                    failure = dict(answer["error"])
                    if self._judge(failure, status):
                        continue  # past events no longer kept: on at once from the earliest
                elif status == 200:
                    failure = {"code": None, "message": "the stream ended without a result"}
                else:
                    failure = {"code": status, "message": f"HTTP {status}: no JSON-RPC response"}
                    if status not in RETRY_STATUSES:
                        raise TaskRequestError(STREAM, failure)
            delay = min(max(pause, wait or 0.0), client.max_backoff)
            if anyio.current_time() + delay > deadline:
                raise TaskUnavailableError(STREAM, failure)
            await anyio.sleep(delay)
            pause = min(pause * 2, client.max_backoff)

    def _accept(self, params: object) -> TaskEvent | None:
        """The event to hand over; None for one already handed over. Checks the order."""
        if not isinstance(params, Mapping):
            raise TaskStreamError(f"task {self.task_id}: an event without params")
        seq = params.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise TaskStreamError(f"task {self.task_id}: an event with seq {seq!r}")
        if params.get("taskId") != self.task_id:
            raise TaskStreamError(
                f"task {self.task_id}: event {seq} of task {params.get('taskId')!r} on its stream"
            )
        last = self.last_seq
        if last is not None and seq <= last:
            self.duplicates += 1
            return None
        if last is not None and seq != last + 1:
            raise TaskStreamError(
                f"task {self.task_id}: event {seq} after {last}; "
                f"events {last + 1}..{seq - 1} were skipped without an events_gone error"
            )
        payload = params.get("payload")
        meta = params.get("_meta")
        event = TaskEvent(
            task_id=self.task_id,
            seq=seq,
            type=str(params.get("type")),
            payload=dict(payload) if isinstance(payload, Mapping) else {},
            meta=dict(meta) if isinstance(meta, Mapping) else {},
        )
        self.last_seq = seq
        return event

    def _judge(self, error: Mapping[str, Any], status: int) -> bool:
        """Raise for an error that ends the stream; True to go on at once, False to retry later."""
        data = error.get("data")
        if (
            error.get("code") == EVENTS_GONE_CODE
            and isinstance(data, Mapping)
            and data.get("reason") == EVENTS_GONE
        ):
            earliest = data.get("earliestSeq")
            if not isinstance(earliest, int) or isinstance(earliest, bool) or earliest < 0:
                raise TaskStreamError(f"task {self.task_id}: events_gone with {earliest!r}")
            first_wanted = 0 if self.last_seq is None else self.last_seq + 1
            if earliest <= first_wanted:
                raise TaskStreamError(
                    f"task {self.task_id}: events_gone from {earliest}, "
                    f"but the stream asked from {first_wanted}"
                )
            if self.on_gone == "raise":
                raise EventsGoneError(error, self.task_id, self.last_seq)
            self.lost.append((first_wanted, earliest - 1))
            self.last_seq = earliest - 1
            return True
        if not transient(error, status):
            raise TaskRequestError(STREAM, error)
        return False


def _json(data: str) -> dict[str, Any] | None:
    try:
        message = json.loads(data) if data else None
    except ValueError:
        return None
    return message if isinstance(message, dict) else None

"""``tasks/stream``: a task's events from a cursor, then live ones, on any replica.

The store is the one source of every event: each read takes, in one atomic
step, the facts a cursor is judged on (the earliest retained ``seq``, the
next one, the task's status) and the events from the cursor on, and the
stream goes on from the last ``seq`` it sent. A replica that does not run
the task therefore has no seam to get wrong between replay and live: it
subscribes to the task's wake-ups first, then reads; an event appended after
the read wakes it and the next read starts exactly after the last one sent.
A lost wake-up costs a poll interval, never an event, and a gap can only
come from retention, which the judge turns into ``events_gone``.

The response is ``{}`` only once the task has ended and every retained event
was sent. A stream this replica ends early (it drains, the store fails) ends
without a result: ``503`` with ``Retry-After`` before any event, a stream cut
without its final message after (:mod:`~replaystore.mcp.unavailable`), so no
client can take an early end for completion.

Every open stream holds a response, a wake-up registration and a store read
per wake-up and per poll interval, so a replica bounds them
(:class:`StreamSlots`): the streams one client holds open for one task
(beyond it, -32602 ``too_many_streams``, as the draft answers a second stream
of a task on one connection) and the streams it serves in all (beyond it,
``503`` with ``Retry-After``: another replica may have room). A stream frees
its slot however it ends.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import anyio
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import BaseModel

from ...errors import StorageError
from ...taskstore.events import EventPage
from ...taskstore.sep2694 import (
    EVENT_NOTIFICATION,
    EVENTS_GONE_CODE,
    EVENTS_GONE_MESSAGE,
    OMITTED,
    TOO_MANY_STREAMS_CODE,
    EventsGone,
    Invalid,
    cursor_form,
    event_params,
    events_gone_data,
    judge_cursor,
    too_many_streams,
)
from ..refusals import bounded
from ..unavailable import replica_busy, store_unavailable, stream_closed
from .params import StreamParams
from .runner import TaskRunner

__all__ = [
    "DEFAULT_CLIENT_STREAMS",
    "DEFAULT_STREAMS",
    "PAGE",
    "StreamSlots",
    "stream_events",
]

logger = logging.getLogger("replaystore.mcp.tasks")

#: Events read from the store per step.
PAGE: Final = 100

#: ``tasks/stream`` requests one client may hold open for one task on one replica:
#: a client needs one (the draft allows one per connection); the rest is room for
#: several windows or processes of one user watching a task, and for streams whose
#: dropped connection the server has not noticed yet when the client resumes.
DEFAULT_CLIENT_STREAMS: Final = 16
#: ``tasks/stream`` requests one replica serves at once: idle, each costs a store
#: read per poll interval, so a full replica reads the store about this many
#: times per ``poll_interval`` for its streams alone.
DEFAULT_STREAMS: Final = 1000

#: Seconds between two log lines saying the replica refuses streams.
_SAY_FULL_EVERY: Final = 60.0

_NOT_FOUND = "Failed to retrieve task: Task not found"


class StreamSlots:
    """The ``tasks/stream`` requests this replica serves, counted per client and task, and in all.

    A client is the principal a request acts for (``ReplayTasks(owner=...)``,
    the authenticated principal by default): on 2026-07-28 every request is
    its own exchange, with no session or connection to count on, and the
    principal is what a task's authorization rests on. Without
    authentication every client is the same principal, so the per-client
    bound is then on the streams of one task, whoever opens them. Counted in
    this process only: a stream's cost is the replica's that serves it.
    """

    def __init__(
        self, per_client: int = DEFAULT_CLIENT_STREAMS, total: int = DEFAULT_STREAMS
    ) -> None:
        if isinstance(per_client, bool) or isinstance(total, bool):
            raise TypeError("stream limits are integers")
        if per_client < 1 or total < 1:
            raise ValueError(
                f"stream limits must be at least 1, not {per_client} per client, {total} in all"
            )
        self.per_client = per_client
        self.total = total
        self._held: dict[tuple[str | None, str], int] = {}
        self._open = 0
        self._said = -math.inf  # when the log last said the replica was full

    @contextmanager
    def taken(self, task_id: str, owner: str | None) -> Iterator[None]:
        """Hold a slot for a stream of ``task_id`` for ``owner`` while inside; refuse it if none.

        Beyond the client's bound: -32602 ``too_many_streams`` (the client
        must end one of its streams first: trying again does not help);
        beyond the replica's: ``503`` with ``Retry-After``. Checked and taken
        with no wait in between, so two requests cannot both take the last
        slot; given back however the stream ends (its result, an error, the
        client's cancel or dropped connection, a drain).
        """
        key = (owner, task_id)
        held = self._held.get(key, 0)
        if held >= self.per_client:
            logger.info("task %s: a stream refused, %d open for its client", task_id, held)
            message, data = too_many_streams(task_id, self.per_client)
            raise MCPError(TOO_MANY_STREAMS_CODE, message, data)
        if self._open >= self.total:
            if time.monotonic() - self._said >= _SAY_FULL_EVERY:  # not a line per refusal
                self._said = time.monotonic()
                logger.warning(
                    "tasks/stream refused (503): %d streams open, the most this replica serves",
                    self._open,
                )
            raise replica_busy(
                f"this server has {self.total} task event streams open, its most; "
                "send the request again later (another replica may serve it)",
                self.total,
            )
        self._held[key] = held + 1
        self._open += 1
        try:
            yield
        finally:
            self._open -= 1
            left = self._held[key] - 1
            if left:
                self._held[key] = left
            else:
                del self._held[key]


class _EventNotification(BaseModel):
    method: str = EVENT_NOTIFICATION
    params: dict[str, Any]


def _refusal(verdict: Invalid | EventsGone, task_id: str) -> MCPError:
    if isinstance(verdict, Invalid):
        return MCPError(INVALID_PARAMS, verdict.message)
    data = events_gone_data(task_id, verdict.earliest)
    return MCPError(EVENTS_GONE_CODE, EVENTS_GONE_MESSAGE, data)


async def stream_events(
    tasks: TaskRunner,
    ctx: ServerRequestContext[Any, Any],
    params: StreamParams,
    owner: str | None,
) -> dict[str, Any]:
    """Serve one ``tasks/stream`` request (the caller checked the extension, the id's shape,
    and that the app answers with SSE streams)."""
    task_id = params.task_id
    after: object = params.after if "after" in params.model_fields_set else OMITTED
    malformed = None if after is OMITTED else cursor_form(after)
    if malformed is not None:
        raise _refusal(malformed, task_id)
    last = after if isinstance(after, int) else None  # the last seq sent
    woken = anyio.Event()

    def wake() -> None:
        woken.set()

    async def read() -> EventPage | None:
        start = None if last is None else last + 1
        page: EventPage | None = None
        with bounded(tasks.store_timeout):  # a StorageError once the store is too slow
            page = await tasks.store.events(task_id, owner=owner, start=start, limit=PAGE)
        return page

    first = True
    async with tasks.store.event_wakeups(task_id, wake):
        while True:
            woken = anyio.Event()
            try:
                page = await read()
            except StorageError as exc:
                logger.warning("task %s: stream read failed, ended early: %s", task_id, exc)
                raise (store_unavailable(exc) if first else stream_closed()) from None
            if page is None:
                if first:
                    raise MCPError(INVALID_PARAMS, _NOT_FOUND)
                raise stream_closed()  # expired meanwhile: nothing more will come
            verdict = judge_cursor(OMITTED if last is None else last, page.floor, page.next_seq)
            if isinstance(verdict, Invalid | EventsGone):
                raise _refusal(verdict, task_id)
            first = False
            if page.rerun:
                await tasks.take_over(task_id, ctx)
            for event in page.events:
                note = _EventNotification(
                    params=event_params(task_id, event.seq, event.type, event.payload)
                )
                # An extension's notification: the SDK sends any model with method and params.
                await ctx.session.send_notification(
                    note,  # type: ignore[arg-type]
                    related_request_id=ctx.request_id,
                )
                last = event.seq
            expected = page.floor if last is None else last + 1
            if page.terminal and expected >= page.next_seq:
                return {}
            if len(page.events) >= PAGE:
                continue
            if tasks.draining:
                raise stream_closed()
            with anyio.move_on_after(tasks.poll_interval):
                await woken.wait()
            if tasks.draining:
                raise stream_closed()
    raise stream_closed()  # not reached: the loop ends by returning or raising

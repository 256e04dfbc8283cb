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
"""

from __future__ import annotations

import logging
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
    EventsGone,
    Invalid,
    cursor_form,
    event_params,
    events_gone_data,
    judge_cursor,
)
from ..refusals import bounded
from ..unavailable import store_unavailable, stream_closed
from .params import StreamParams
from .runner import TaskRunner

__all__ = ["PAGE", "stream_events"]

logger = logging.getLogger("replaystore.mcp.tasks")

#: Events read from the store per step.
PAGE: Final = 100

_NOT_FOUND = "Failed to retrieve task: Task not found"


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

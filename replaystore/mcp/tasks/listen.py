"""``subscriptions/listen`` with ``notifications.taskIds``: task status on a listen stream.

The SDK's listen handler knows the core event kinds only. This handler serves
the same kinds from the same bus (so list-changed and resource-updated events
keep flowing, from every replica with a
:class:`~replaystore.mcp.StoreSubscriptionBus`), and adds the tasks
extension's kind: for each requested task the listener may see, a
``notifications/tasks`` carrying the full ``DetailedTask`` whenever the task
changes, the first one at once (so a listener never misses an end that came
before it subscribed).

Task changes are read from the store, not pushed: each stream reads its tasks
every check interval and sends what changed. That is what makes it work
across replicas with nothing else to run. A task whose runner died is ended
(or claimed to run again) by whichever looks first, this read or the
replicas' background scan; either way the stream sends the outcome within an
interval. Every notification is
the record as ``tasks/get`` returns it at that moment; the last one of a task
is identical to ``tasks/get`` from then on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver.server import require_client_extension
from mcp.server.subscriptions import SUBSCRIPTION_ID_META_KEY, ServerEvent, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import event_matches, event_to_notification
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)
from pydantic import BaseModel

from ...errors import StorageError
from ...taskstore import TaskRecord, valid_task_id

if TYPE_CHECKING:
    from .extension import ReplayTasks

__all__ = ["TaskListenHandler"]

logger = logging.getLogger(__name__)

#: Tasks one listen stream may follow.
MAX_TASK_IDS = 64

_Item = ServerEvent | dict[str, Any]


class _TaskNotification(BaseModel):
    method: str = "notifications/tasks"
    params: dict[str, Any]


class TaskListenHandler:
    """Serves ``subscriptions/listen``: the core kinds from ``bus``, and ``taskIds``.

    Installed by ``streamable_http_app(..., tasks=..., subscriptions=...)``.
    A client that asks for ``taskIds`` without declaring the tasks extension
    gets -32021; ids it may not see (unknown, expired, another owner's) are
    left out of the acknowledgement, like a subscription that never fires.
    """

    def __init__(
        self,
        bus: SubscriptionBus,
        tasks: ReplayTasks,
        *,
        max_subscriptions: int = 1024,
        max_buffered_events: int = 1024,
    ) -> None:
        self._bus = bus
        self._tasks = tasks
        self._max_subscriptions = max_subscriptions
        self._max_buffered = max_buffered_events
        self._open = 0

    async def _visible(
        self, ctx: ServerRequestContext[Any, Any], requested: SubscriptionFilter
    ) -> list[str] | None:
        raw = (requested.model_extra or {}).get("taskIds")
        if raw is None:
            return None
        if not self._tasks.declared(ctx):
            require_client_extension(ctx, self._tasks.identifier)
        if not isinstance(raw, list) or not all(isinstance(i, str) for i in raw):
            raise MCPError(INVALID_PARAMS, "notifications.taskIds is a list of task ids")
        if len(raw) > MAX_TASK_IDS:
            raise MCPError(INVALID_PARAMS, f"at most {MAX_TASK_IDS} taskIds per listen stream")
        owner = self._tasks.owner_of(ctx)
        visible = []
        for task_id in dict.fromkeys(raw):
            if valid_task_id(task_id) and await self._get(task_id, owner) is not None:
                visible.append(task_id)
        return visible

    async def _get(self, task_id: str, owner: str | None) -> TaskRecord | None:
        try:
            return await self._tasks.store.get(task_id, owner=owner)
        except StorageError as exc:
            raise MCPError(INTERNAL_ERROR, "the task store is unreachable") from exc

    async def __call__(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: SubscriptionsListenRequestParams,
    ) -> SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if self._open >= self._max_subscriptions:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        requested = params.notifications
        task_ids = await self._visible(ctx, requested)
        honored = SubscriptionFilter(
            tools_list_changed=True if requested.tools_list_changed else None,
            prompts_list_changed=True if requested.prompts_list_changed else None,
            resources_list_changed=True if requested.resources_list_changed else None,
            resource_subscriptions=list(requested.resource_subscriptions or []) or None,
        )
        if task_ids is not None:
            # An extension's key: the filter keeps unknown keys and echoes them.
            honored = SubscriptionFilter.model_validate(
                {**honored.model_dump(by_alias=True, exclude_none=True), "taskIds": task_ids}
            )
        uris = frozenset(honored.resource_subscriptions or ())
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        send, recv = anyio.create_memory_object_stream[_Item](self._max_buffered)

        def deliver(event: ServerEvent) -> None:
            if event_matches(honored, uris, event):
                try:
                    send.send_nowait(event)
                except (anyio.ClosedResourceError, anyio.WouldBlock):
                    send.close()  # a reader that stopped reading: end its stream

        unsubscribe = self._bus.subscribe(deliver)
        self._open += 1
        try:
            await ctx.session.send_notification(
                SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(
                        notifications=honored, _meta=meta
                    )
                ),
                related_request_id=subscription_id,
            )
            async with anyio.create_task_group() as group:
                if task_ids:
                    group.start_soon(self._follow, task_ids, self._tasks.owner_of(ctx), send, ctx)
                async for item in recv:
                    if isinstance(item, dict):
                        note: Any = _TaskNotification(params={**item, "_meta": meta})
                    else:
                        note = event_to_notification(item, meta)
                    await ctx.session.send_notification(note, related_request_id=subscription_id)
                group.cancel_scope.cancel()
        finally:
            try:
                unsubscribe()
            except Exception:
                logger.exception("bus unsubscribe raised; continuing")
            self._open -= 1
            send.close()
            recv.close()
        return SubscriptionsListenResult(_meta=meta)

    async def _follow(
        self,
        task_ids: list[str],
        owner: str | None,
        send: MemoryObjectSendStream[_Item],
        ctx: Any,
    ) -> None:
        """Send each task's state when it changes, until it ends (or vanishes).

        A re-runnable task whose runner died is claimed here too (and run
        again on this replica if it wins), so a task only listened to is
        never left without a runner.
        """
        seen: dict[str, tuple[str, int]] = {}
        following = list(task_ids)
        while following:
            for task_id in list(following):
                try:
                    record = await self._tasks.store.get(task_id, owner=owner)
                except StorageError as exc:
                    logger.warning("listen: task %s unreadable: %s", task_id, exc)
                    continue
                if record is None:  # expired: nothing more will come
                    following.remove(task_id)
                    continue
                if record.rerun:
                    await self._tasks.take_over(task_id, ctx)
                state = (record.status, record.updated_ms)
                if seen.get(task_id) != state:
                    seen[task_id] = state
                    try:
                        send.send_nowait(record.detailed())
                    except (anyio.ClosedResourceError, anyio.WouldBlock):
                        send.close()
                        return
                if record.terminal:
                    following.remove(task_id)
            await anyio.sleep(self._tasks.check_interval)

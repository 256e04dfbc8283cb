"""FastMCP 4: ``mcp.http_app(event_store=...)``, resumable through a ReplayBuffer.

FastMCP builds its session manager inside the app's lifespan and wraps the
event store per transport with a *random* prefix (not the real session id), so
no other process could ever resume those streams, and its store answers an
unknown id with an empty 200. :func:`fastmcp_http_app` keeps FastMCP's app as
it is (routes, auth, middleware, host/origin guard) and, once the lifespan
has built the manager and before any request is served, adopts it as a
:class:`~replaystore.mcp.ReplaySessionManager`: each session then gets a store
view keyed by its real ``Mcp-Session-Id`` and the fail-closed transport.
No module global is patched, so other FastMCP apps in the process are untouched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from ..buffer import ReplayBuffer
from .manager import HEALTH_PATH, ReplaySessionManager, add_health_route, as_event_store
from .metrics import ResumptionObserver
from .sdk import check as check_sdk
from .settings import DEFAULT_CHECK_INTERVAL, DEFAULT_LEASE_TTL, DEFAULT_STORE_TIMEOUT, Settings
from .view import ReplayEventStore

if TYPE_CHECKING:
    from .listen import StoreSubscriptionBus
    from .tasks import ReplayTasks

__all__ = ["fastmcp_http_app"]


def fastmcp_http_app(
    mcp: Any,
    buffer: ReplayBuffer | ReplayEventStore,
    *,
    observer: ResumptionObserver | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    check_interval: float = DEFAULT_CHECK_INTERVAL,
    store_timeout: float = DEFAULT_STORE_TIMEOUT,
    tasks: ReplayTasks | None = None,
    subscriptions: StoreSubscriptionBus | None = None,
    **kwargs: Any,
) -> Any:
    """``mcp.http_app(**kwargs)`` with ``buffer`` as its resumable event store.

    ``mcp`` is a ``fastmcp.FastMCP``; ``kwargs`` are those of ``http_app``
    (``path``, ``retry_interval``, ``middleware`` …) except ``event_store`` and
    ``transport`` (always streamable HTTP). Returns FastMCP's Starlette app;
    mount it with ``lifespan=app.lifespan`` as usual. Once running, the app
    also answers the health check at ``/healthz``.

    ``tasks``: a :class:`~replaystore.mcp.tasks.ReplayTasks` (not registered
    on ``mcp`` yet): it is added to ``mcp`` as a FastMCP extension
    (:class:`~replaystore.mcp.fastmcp_tasks.FastMCPTasks`, with the
    :class:`~replaystore.mcp.fastmcp_tasks.TaskContexts` transform that lets
    task tools ask for input through ``ctx.elicit``), its tasks are kept in
    the buffer's store, and its tools run while the app's lifespan is open.
    ``subscriptions``: a :class:`~replaystore.mcp.listen.StoreSubscriptionBus`;
    with both, ``subscriptions/listen`` is served (FastMCP alone answers it
    with -32601): streams carry ``notifications.taskIds`` and the events
    published on the bus by any replica, and ``server/discover`` says so
    (``listChanged``, ``resources.subscribe``).
    """
    check_sdk(fastmcp=True)
    if "event_store" in kwargs:
        raise TypeError("pass the buffer instead of event_store")
    if kwargs.get("transport", "http") not in ("http", "streamable-http"):
        raise ValueError("resumability needs the streamable HTTP transport")
    store = as_event_store(buffer, observer)
    settings = Settings(
        lease_ttl=lease_ttl, check_interval=check_interval, store_timeout=store_timeout
    )
    if tasks is not None:
        from .fastmcp_tasks import FastMCPTasks, TaskContexts, tool_names

        tasks.bind(store.buffer, mcp)
        tasks.served_by(lambda: tool_names(mcp))
        mcp.add_extension(FastMCPTasks(tasks))
        mcp.add_transform(TaskContexts())
    if subscriptions is not None:
        subscriptions.bind(store.buffer)
    if tasks is not None and subscriptions is not None:
        from .fastmcp_tasks import ListenMiddleware
        from .task_listen import TaskListenHandler

        mcp.add_middleware(ListenMiddleware(TaskListenHandler(subscriptions, tasks)))
    app = mcp.http_app(event_store=store, **kwargs)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(starlette_app: Any) -> AsyncIterator[Any]:
        async with AsyncExitStack() as stack:
            if subscriptions is not None:
                await stack.enter_async_context(subscriptions.running())
            if tasks is not None:
                # Entered first, left last: a task still running when the
                # server stops fails with an error saying so.
                await stack.enter_async_context(tasks.running())
            state = await stack.enter_async_context(inner(starlette_app))
            managers = list(_session_managers(app))
            if not managers and not kwargs.get("stateless_http"):
                raise RuntimeError("FastMCP app has no streamable HTTP session manager to adopt")
            for manager in managers:
                adopted = ReplaySessionManager.adopt(manager, store, settings)
                # FastMCP entered the manager's run() before it could be adopted.
                await stack.enter_async_context(adopted.replicating())
                if not any(getattr(r, "path", None) == HEALTH_PATH for r in app.router.routes):
                    add_health_route(app, adopted)
            if tasks is not None:
                # Once the server runs: a tool it runs again needs its lifespan state.
                lifespan_state = (lambda: managers[0]._lifespan_state) if managers else None
                await stack.enter_async_context(tasks.reaping(lifespan_state))
            yield state

    app.router.lifespan_context = lifespan
    return app


def _session_managers(app: Any) -> list[StreamableHTTPSessionManager]:
    """The session managers behind the app's routes (through auth wrappers' ``.app``)."""
    found: list[StreamableHTTPSessionManager] = []
    for route in getattr(app, "routes", []):
        node = getattr(route, "endpoint", None)
        for _ in range(6):
            if node is None:
                break
            manager = getattr(node, "session_manager", None)
            if isinstance(manager, StreamableHTTPSessionManager):
                if manager not in found:
                    found.append(manager)
                break
            node = getattr(node, "app", None)
    return found

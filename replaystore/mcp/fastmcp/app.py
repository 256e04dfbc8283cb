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
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ...buffer import ReplayBuffer
from .._sdk.checked import check as check_sdk
from ..app import Process, session_managers, wire
from ..metrics import ResumptionObserver
from ..process import COLLECTOR_THRESHOLD, LOG_RECORD_LIMIT
from ..sessions.event_store import ReplayEventStore, as_event_store
from ..settings import (
    DEFAULT_CHECK_INTERVAL,
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_LEASE_TTL,
    DEFAULT_STORE_TIMEOUT,
    Settings,
)

if TYPE_CHECKING:
    from mcp.server.request_state import RequestStateSecurity
    from mcp.server.subscriptions import SubscriptionBus

    from ..request_state import Secret
    from ..tasks.extension import ReplayTasks

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
    subscriptions: SubscriptionBus | None = None,
    request_state: RequestStateSecurity | None = None,
    request_state_once: bool = True,
    request_state_secret: Secret | None = None,
    share: bool = True,
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
    collector_threshold: int | None = COLLECTOR_THRESHOLD,
    log_record_limit: int | None = LOG_RECORD_LIMIT,
    check_store: bool = True,
    metrics_path: str | None = None,
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
    (:class:`~replaystore.mcp.fastmcp.FastMCPTasks`, with the
    :class:`~replaystore.mcp.fastmcp.TaskContexts` transform that lets
    task tools ask for input through ``ctx.elicit``), its tasks are kept in
    the buffer's store, and its tools run while the app's lifespan is open.
    ``subscriptions/listen`` is served (FastMCP alone answers it with
    -32601) from a :class:`~replaystore.mcp.StoreSubscriptionBus`
    (``subscriptions``: a bus of your own instead): streams carry the events
    published on the bus by any replica (and, with ``tasks``,
    ``notifications.taskIds``), and ``server/discover`` says so
    (``listChanged``, ``resources.subscribe``). ``requestState`` is sealed
    under a key kept in the store unless the server was given its own
    ``request_state_security`` (or ``request_state`` is given here), derived
    from ``request_state_secret`` (or ``REPLAYSTORE_REQUEST_STATE_SECRET``)
    when there is one, and each ``requestState`` runs its round once across
    the replicas unless ``request_state_once=False``.
    ``share=False`` keeps FastMCP's own per-process defaults for both
    (:mod:`replaystore.mcp.app` lists what replicas share). ``metrics_path``
    (e.g. ``"/metrics"``, needs ``replaystore[prometheus]``): where the app
    answers Prometheus scrapes (:mod:`replaystore.mcp.metrics`).

    ``drain_seconds``, ``collector_threshold``, ``log_record_limit`` and
    ``check_store``: what the app does to its process, as with
    :func:`~replaystore.mcp.streamable_http_app` (served by uvicorn, it
    drains when told to stop). :func:`~replaystore.mcp.manager_of` gives its
    session manager once it started.
    """
    check_sdk(fastmcp=True)
    if "event_store" in kwargs:
        raise TypeError("pass the buffer instead of event_store")
    if kwargs.get("transport", "http") not in ("http", "streamable-http"):
        raise ValueError("resumability needs the streamable HTTP transport")
    process = Process(drain_seconds, collector_threshold, log_record_limit, check_store)
    store = as_event_store(buffer, observer)
    settings = Settings(
        lease_ttl=lease_ttl, check_interval=check_interval, store_timeout=store_timeout
    )

    def build() -> Any:
        app = mcp.http_app(**kwargs)
        if not kwargs.get("stateless_http"):
            _expect_manager(app)
        return app

    return wire(
        mcp,
        store,
        settings,
        build,
        fastmcp=True,
        tasks=tasks,
        subscriptions=subscriptions,
        request_state=request_state,
        request_state_once=request_state_once,
        request_state_secret=request_state_secret,
        share=share,
        process=process,
        metrics_path=metrics_path,
    )


def _expect_manager(app: Any) -> None:
    """Fail once the app starts if FastMCP built no session manager to adopt."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(starlette_app: Any) -> AsyncIterator[Any]:
        async with inner(starlette_app) as state:
            if not session_managers(app):
                raise RuntimeError("FastMCP app has no streamable HTTP session manager to adopt")
            yield state

    app.router.lifespan_context = lifespan

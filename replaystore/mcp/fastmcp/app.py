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

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from .._sdk.checked import check as check_sdk
from .._sdk.servers import fastmcp_lowlevel, fastmcp_own_request_state
from ..app import http_app, serving, session_managers
from ..subscriptions import StoreSubscriptionBus

if TYPE_CHECKING:
    from mcp.server.request_state import RequestStateSecurity
    from mcp.server.subscriptions import SubscriptionBus

    from ..tasks.extension import ReplayTasks

__all__ = ["FastMCPServer", "fastmcp_http_app"]


class FastMCPServer:
    """A ``fastmcp.FastMCP`` server, as the app wiring sees it.

    The :class:`~replaystore.mcp.app.Framework` of FastMCP, which builds its
    session managers when the app starts, serves tasks through its own
    extension point, and answers ``subscriptions/listen`` only through a
    middleware.
    """

    starts_managers = True

    def __init__(self, server: Any) -> None:
        check_sdk(fastmcp=True)
        self.server = server
        self.lowlevel = fastmcp_lowlevel(server)

    def check(self, kwargs: dict[str, Any]) -> None:
        """Streamable HTTP only: no other transport resumes."""
        if kwargs.get("transport", "http") not in ("http", "streamable-http"):
            raise ValueError("resumability needs the streamable HTTP transport")

    def build(self, kwargs: dict[str, Any]) -> Any:
        app = self.server.http_app(**kwargs)
        if not kwargs.get("stateless_http"):
            _expect_manager(app)
        return app

    def serve_tasks(self, tasks: ReplayTasks) -> None:
        """Add ``tasks`` as a FastMCP extension, with the transform making ``ctx.elicit`` work."""
        from .tasks import FastMCPTasks, TaskContexts, tool_names

        server = self.server
        tasks.served_by(lambda: tool_names(server))
        server.add_extension(FastMCPTasks(tasks))
        server.add_transform(TaskContexts())

    def own_request_state(self, current: RequestStateSecurity) -> bool:
        """``FastMCP(request_state_security=...)``: FastMCP keeps it apart from its default."""
        return fastmcp_own_request_state(self.server)

    def serve_listen(
        self,
        given: SubscriptionBus | None,
        share: bool,
        handler: Callable[[SubscriptionBus], Any],
    ) -> SubscriptionBus | None:
        """FastMCP alone answers -32601: served through :class:`ListenMiddleware`."""
        bus = given if given is not None else (StoreSubscriptionBus() if share else None)
        if bus is None:
            return None
        from .listen import ListenMiddleware

        self.server.add_middleware(ListenMiddleware(handler(bus)))
        return bus

    def session_managers(self, app: Any) -> list[StreamableHTTPSessionManager]:
        return session_managers(app)

    def advertise(self, tasks: ReplayTasks) -> None:
        """FastMCP asks :class:`FastMCPTasks` for its settings whenever it advertises them."""


fastmcp_http_app = serving(
    FastMCPServer,
    http_app,
    "fastmcp_http_app",
    """``server.http_app(**kwargs)`` with ``buffer`` as its resumable event store.

    ``server`` is a ``fastmcp.FastMCP``; ``kwargs`` are those of ``http_app``
    (``path``, ``retry_interval``, ``middleware`` …) except ``event_store`` and
    ``transport`` (always streamable HTTP). Returns FastMCP's Starlette app;
    mount it with ``lifespan=app.lifespan`` as usual. Once running, the app
    also answers the health check at ``/healthz``.

    ``tasks``: a :class:`~replaystore.mcp.tasks.ReplayTasks` (not registered
    on ``server`` yet): it is added to ``server`` as a FastMCP extension
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
    drains when told to stop). The buffer is closed when the app stops only
    with ``close_buffer=True``. :func:`~replaystore.mcp.manager_of` gives its
    session manager once it started.
    """,
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

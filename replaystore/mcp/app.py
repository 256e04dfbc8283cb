"""One wiring for every app: what replicas share through the store, and the lifespan running it.

Giving an app a buffer makes it one replica among every app on that buffer's
store, and a client may reach any replica with any request. So everything
a client can see from any replica is shared by default, with nothing else to
pass:

- **sessions** (2025-11-25) and their streams: the session manager;
- **tasks** (2026-07-28, when a :class:`~replaystore.mcp.tasks.ReplayTasks`
  is given): their records, leases and input;
- **``requestState``** of multi-round calls (2026-07-28): sealed under a key
  kept in the store (:class:`~replaystore.mcp.StoreKeyRing`),
  unless the application gave a policy of its own;
- **``subscriptions/listen`` events** (2026-07-28): published into the store
  and delivered by every replica
  (:class:`~replaystore.mcp.StoreSubscriptionBus`), unless the
  application gave a bus of its own.

``share=False`` keeps the server's own ``requestState`` policy and listen
bus (per process by default). :func:`streamable_http_app` (the official
SDK), :func:`~replaystore.mcp.fastmcp_http_app` (FastMCP) and the example
server are all built by :func:`wire`, so they share exactly the same things.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from mcp.server.request_state import (
    AESGCMRequestStateCodec,
    RequestStateBoundary,
    RequestStateSecurity,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, SubscriptionBus
from mcp_types import SubscriptionsListenRequestParams
from starlette.applications import Starlette
from starlette.middleware import Middleware

from ..backends.coordination import Coordination, coordination_of
from ..buffer import ReplayBuffer
from ._sdk.checked import lowlevel_server
from ._sdk.servers import (
    boundary_security,
    lifespan_state,
    replace_subscriptions,
    subscriptions_of,
)
from .metrics import Held, ResumptionObserver, serve_metrics, watch
from .process import (
    COLLECTOR_THRESHOLD,
    LOG_RECORD_LIMIT,
    Process,
    capping_records,
    tune_collector_once,
)
from .request_state import Secret, SingleUseBoundary, StoreKeyRing
from .sessions.event_store import ReplayEventStore, as_event_store
from .sessions.health import HEALTH_PATH, add_health_route
from .sessions.lane import ResumeLane
from .sessions.manager import ReplaySessionManager
from .settings import (
    DEFAULT_CHECK_INTERVAL,
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_LEASE_TTL,
    DEFAULT_STORE_TIMEOUT,
    Settings,
)
from .stopping import draining_on_stop
from .subscriptions import EndsOnGap, StoreSubscriptionBus
from .unavailable import UnavailableStatus

if TYPE_CHECKING:
    # The tasks stack is loaded only by an app given tasks: a 2025-11-25 app never imports it.
    from .tasks.extension import ReplayTasks

__all__ = [
    "Framework",
    "Process",
    "SDKServer",
    "Shared",
    "http_app",
    "manager_of",
    "serving",
    "session_managers",
    "streamable_http_app",
    "wire",
]

logger = logging.getLogger("replaystore.mcp")

#: The app a server builds (a Starlette app).
_App = TypeVar("_App", covariant=True)


@dataclass(eq=False)  # one per app, kept in a weak set by the metrics
class Shared:
    """What an app shares with the other replicas beyond sessions (``app.state.replaystore``).

    ``request_state``: the policy sealing ``requestState`` (None when the
    server has none, e.g. a low-level ``Server`` without the SDK's boundary);
    ``key_ring`` is set when that policy seals under the store's key.
    ``subscriptions``: the bus listen streams read (None when the server does
    not serve ``subscriptions/listen``); ``shared_bus`` when it goes through
    the store. ``tasks``: the tasks extension, if any.
    """

    request_state: RequestStateSecurity | None = None
    key_ring: StoreKeyRing | None = None
    subscriptions: SubscriptionBus | None = None
    tasks: ReplayTasks | None = None
    managers: list[ReplaySessionManager] = field(default_factory=list)

    @property
    def shared_bus(self) -> StoreSubscriptionBus | None:
        bus = self.subscriptions
        return bus if isinstance(bus, StoreSubscriptionBus) else None

    def held(self) -> Held:
        """What the app holds now, for the gauges (:mod:`~replaystore.mcp.metrics`)."""
        bus = self.shared_bus
        return Held(
            sessions=sum(manager.sessions_open for manager in self.managers),
            request_leases=sum(manager.replica.leases_held for manager in self.managers),
            task_states=self.tasks.running_states() if self.tasks is not None else [],
            listening=bus.listeners if bus is not None else 0,
        )


class Framework(Protocol[_App]):
    """What differs between the servers an app is built on, chosen once: the SDK's or FastMCP's.

    :func:`wire` asks it and never which server it is: :class:`SDKServer`
    for an ``MCPServer`` or a low-level ``Server``, and
    :class:`~replaystore.mcp.fastmcp.app.FastMCPServer` for FastMCP.
    """

    #: Whether the server builds its session managers when the app starts
    #: (adopted then), rather than with the app (adopted at once).
    starts_managers: bool

    @property
    def server(self) -> Any:
        """The server the application built (``MCPServer``, ``Server``, ``FastMCP``)."""
        ...

    @property
    def lowlevel(self) -> Any:
        """The low-level ``Server`` whose middleware and handlers the wiring extends."""
        ...

    def check(self, kwargs: dict[str, Any]) -> None:
        """Refuse options of the server's own app that resumability cannot take."""
        ...

    def build(self, kwargs: dict[str, Any]) -> _App:
        """The server's own app (``kwargs``: its options)."""
        ...

    def serve_tasks(self, tasks: ReplayTasks) -> None:
        """Serve ``tasks`` through the server's own extension point, once they are bound."""
        ...

    def own_request_state(self, current: RequestStateSecurity) -> bool:
        """Whether ``current`` is a policy the application gave, told from the default."""
        ...

    def serve_listen(
        self,
        given: SubscriptionBus | None,
        share: bool,
        handler: Callable[[SubscriptionBus], Any],
    ) -> SubscriptionBus | None:
        """Serve ``subscriptions/listen`` with ``handler(bus)``; the bus, or None if not served.

        The bus ``given`` wins; with ``share``, a :class:`StoreSubscriptionBus`
        replaces the server's per-process default.
        """
        ...

    def session_managers(self, app: Any) -> list[StreamableHTTPSessionManager]:
        """The session managers the server built for ``app``."""
        ...

    def advertise(self, tasks: ReplayTasks) -> None:
        """Say in ``server/discover`` what the tasks serve, once the session manager is known."""
        ...


class SDKServer:
    """The official SDK's servers: an ``MCPServer`` or a low-level ``Server``."""

    starts_managers = False

    def __init__(self, server: Any) -> None:
        self.server = server
        self.lowlevel = lowlevel_server(server)

    def check(self, kwargs: dict[str, Any]) -> None:
        """Every option of ``streamable_http_app`` but ``event_store`` is the SDK's to take."""

    def build(self, kwargs: dict[str, Any]) -> Starlette:
        return cast(_ServesStreamableHTTP, self.server).streamable_http_app(**kwargs)

    def serve_tasks(self, tasks: ReplayTasks) -> None:
        """The application gave ``tasks`` to the server itself (``extensions=[tasks]``)."""

    def own_request_state(self, current: RequestStateSecurity) -> bool:
        """A codec of the application's own; a policy from ``keys=`` looks like the default."""
        return not isinstance(getattr(current, "codec", None), AESGCMRequestStateCodec)

    def serve_listen(
        self,
        given: SubscriptionBus | None,
        share: bool,
        handler: Callable[[SubscriptionBus], Any],
    ) -> SubscriptionBus | None:
        """The bus given, then the ``MCPServer``'s own; a server not serving listen is left so.

        ``MCPServer(subscriptions=False)`` or a low-level ``Server`` without a
        handler serves no listen stream unless a bus is given.
        """
        server, lowlevel = self.server, self.lowlevel
        current = subscriptions_of(server) if server is not lowlevel else None
        serves = lowlevel.get_request_handler("subscriptions/listen") is not None
        if given is not None:
            bus = given
        elif current is not None and serves:
            default = isinstance(current, InMemorySubscriptionBus)
            bus = StoreSubscriptionBus() if share and default else current
        else:
            return None
        if current is not None:
            replace_subscriptions(server, bus)  # what ctx.notify_* publishes to
        lowlevel.add_request_handler(
            "subscriptions/listen", SubscriptionsListenRequestParams, handler(bus)
        )
        return bus

    def session_managers(self, app: Any) -> list[StreamableHTTPSessionManager]:
        return [cast(_ServesStreamableHTTP, self.server).session_manager]

    def advertise(self, tasks: ReplayTasks) -> None:
        """The SDK read the extension's settings when the server was built: update them."""
        advertised = getattr(self.lowlevel, "extensions", None)
        if isinstance(advertised, dict) and tasks.identifier in advertised:
            advertised[tasks.identifier] = tasks.settings()


def wire(
    framework: Framework[Any],
    store: ReplayEventStore,
    settings: Settings,
    build: Callable[[], Any],
    *,
    tasks: ReplayTasks | None = None,
    subscriptions: SubscriptionBus | None = None,
    request_state: RequestStateSecurity | None = None,
    request_state_once: bool = True,
    request_state_secret: Secret | None = None,
    share: bool = True,
    outer: AbstractAsyncContextManager[Any] | None = None,
    process: Process | None = None,
    metrics_path: str | None = None,
) -> Any:
    """Build the app with ``build()`` and make it a replica of every app on ``store``.

    ``framework`` is the server the app is built on (:class:`Framework`).
    Before ``build()``: the tasks extension, the ``requestState`` policy and
    the listen bus are put on the server. After: its session managers are
    adopted (when the app starts, if the server builds them then), the
    health check is added, and the app's lifespan runs, outermost first,
    ``outer``, the log cap, the tasks, the bus, the key ring, the app's own
    lifespan, the background scan for orphaned tasks, then the watch for the
    server's stop (the drain); the garbage collector is tuned once all of it
    started (``process``: :class:`Process`). With tasks, a ``tasks/*``
    request whose ``Mcp-Name`` disagrees with its body is refused
    (:meth:`~replaystore.mcp.tasks.ReplayTasks.name_header`).
    ``metrics_path``: where the app answers Prometheus scrapes
    (:func:`~replaystore.mcp.metrics.serve_metrics`).
    """
    buffer = store.buffer
    # Resolved once: each part below is handed what it keeps in the store.
    coordination = coordination_of(buffer.backend)
    process = process if process is not None else Process()
    shared = Shared(tasks=tasks)
    watch(shared)
    lowlevel = framework.lowlevel
    if tasks is not None:
        tasks.serve(framework.server)
        tasks.keep_in(coordination, buffer.backend)
        tasks.store_timeout = settings.store_timeout
        tasks.drain_seconds = process.drain_seconds
        framework.serve_tasks(tasks)
        lowlevel.middleware.append(tasks.name_header)
    _share_request_state(
        shared,
        framework,
        coordination,
        request_state,
        share,
        once=request_state_once,
        secret=request_state_secret,
        store_timeout=settings.store_timeout,
    )
    _share_listen(shared, framework, coordination, subscriptions, share)
    app = build()
    if tasks is not None:
        # A task request the store did not serve: 503 with Retry-After, as on a session.
        app.add_middleware(UnavailableStatus)
    if not framework.starts_managers:
        for manager in framework.session_managers(app):
            _adopt(app, manager, store, settings, shared, process.check_store, coordination)
        if tasks is not None:
            framework.advertise(tasks)
    # Innermost of the app's middleware: every layer of the app's own (and the
    # user's) still sees a resume first; only the routing is skipped.
    app.user_middleware.append(Middleware(ResumeLane, starlette=app))
    app.state.replaystore = shared
    if metrics_path is not None:
        observer = serve_metrics(app, metrics_path)
        if store.observer is None and observer is not None:
            store.observer = observer
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(starlette_app: Any) -> AsyncIterator[Any]:
        async with AsyncExitStack() as stack:
            if outer is not None:
                await stack.enter_async_context(outer)
            stack.enter_context(capping_records(process.log_record_limit))
            if tasks is not None:
                # Before the server, left after it: a task still running when
                # the server stops fails with an error saying so. First, so
                # that its check of the tools stops the app with its own error.
                await stack.enter_async_context(tasks.running())
            bus = shared.shared_bus
            if bus is not None:
                await stack.enter_async_context(bus.running())
            if shared.key_ring is not None:
                await stack.enter_async_context(shared.key_ring.running())
            state = await stack.enter_async_context(inner(starlette_app))
            if framework.starts_managers:
                # The server entered each manager's run() before it could be adopted.
                for manager in framework.session_managers(app):
                    adopted = _adopt(
                        app, manager, store, settings, shared, process.check_store, coordination
                    )
                    await stack.enter_async_context(adopted.replicating())
            if tasks is not None:
                # Once the server runs: a tool it runs again needs its lifespan state.
                managers = shared.managers
                state_of = (lambda: lifespan_state(managers[0])) if managers else None
                await stack.enter_async_context(tasks.reaping(state_of))
            await stack.enter_async_context(
                draining_on_stop(shared.managers, tasks, process.drain_seconds)
            )
            # What start-up built stays: see replaystore.mcp.process.
            tune_collector_once(process.collector_threshold)
            yield state

    app.router.lifespan_context = lifespan
    return app


def _adopt(
    app: Any,
    manager: StreamableHTTPSessionManager,
    store: ReplayEventStore,
    settings: Settings,
    shared: Shared,
    check_store: bool,
    coordination: Coordination,
) -> ReplaySessionManager:
    """Adopt one of the server's session managers, before it serves any request."""
    if shared.tasks is not None:
        shared.tasks.json_responses = manager.json_response
    adopted = ReplaySessionManager.adopt(manager, store, settings, coordination=coordination)
    adopted.store_checked = not check_store
    shared.managers.append(adopted)
    if not any(getattr(r, "path", None) == HEALTH_PATH for r in app.router.routes):
        add_health_route(app, adopted)
    return adopted


def _share_request_state(
    shared: Shared,
    framework: Framework[Any],
    coordination: Coordination,
    given: RequestStateSecurity | None,
    share: bool,
    *,
    once: bool,
    secret: Secret | None,
    store_timeout: float,
) -> None:
    """Seal ``requestState`` so that every replica opens it, and run each token's round once.

    The policy ``given`` to the app wins. Otherwise a policy the application
    gave the server is kept when it can be told from the SDK's per-process
    default: FastMCP keeps it (``FastMCP(request_state_security=...)``), and
    on ``MCPServer`` a codec of the application's own. An ``MCPServer`` policy
    built from ``keys=`` looks exactly like the default (both are one
    AES-GCM codec), so the store's key seals there too, and the server's own
    keys still open: pass the policy to the app to seal under your keys.
    The store's key is derived from ``secret`` (or the
    ``REPLAYSTORE_REQUEST_STATE_SECRET`` environment variable) when there is
    one (:class:`StoreKeyRing`).

    Whichever policy seals, with ``share`` and ``once`` each token runs its
    round once across the replicas (:class:`SingleUseBoundary`).
    """
    lowlevel = framework.lowlevel
    index, boundary = _boundary(lowlevel)
    current = boundary_security(boundary)
    shared.request_state = current
    policy = given
    if policy is None:
        if boundary is None:
            return
        assert current is not None
        if framework.own_request_state(current):
            policy = current
        elif not share:
            if coordination.spans_processes:
                # Said once, when the app is built: never accepted silently.
                logger.warning(
                    "share=False: requestState is sealed under the server's own key; unless "
                    "every replica was given that key, a multi-round call continued on "
                    "another replica fails with 'Invalid or expired requestState'"
                )
            return
        else:
            ring = StoreKeyRing(fallback=current.codec, secret=secret)
            ring.keep_in(coordination)
            policy = RequestStateSecurity(
                codec=ring,
                ttl=current.ttl,
                bind_principal=current.bind_principal,
                audience=current.audience,
            )
            shared.key_ring = ring
    shared.request_state = policy
    if share and once:
        _install(
            lowlevel,
            index,
            SingleUseBoundary(
                policy,
                default_audience=lowlevel.name,
                coordination=coordination,
                store_timeout=store_timeout,
            ),
        )
    elif policy is not current:
        _install(lowlevel, index, RequestStateBoundary(policy, default_audience=lowlevel.name))


def _boundary(lowlevel: Any) -> tuple[int, Any]:
    for index, middleware in enumerate(lowlevel.middleware):
        if isinstance(middleware, RequestStateBoundary):
            return index, middleware
    return -1, None


def _install(lowlevel: Any, index: int, boundary: RequestStateBoundary) -> None:
    if index < 0:
        lowlevel.middleware.insert(0, boundary)
    else:
        lowlevel.middleware[index] = boundary


def _share_listen(
    shared: Shared,
    framework: Framework[Any],
    coordination: Coordination,
    given: SubscriptionBus | None,
    share: bool,
) -> None:
    """Serve ``subscriptions/listen`` from a bus every replica publishes into.

    The bus ``given`` to the app wins, then one the application gave the
    server; the server's in-process default is replaced by a
    :class:`StoreSubscriptionBus` (:meth:`Framework.serve_listen`).
    """
    tasks = shared.tasks
    bus = framework.serve_listen(given, share, lambda bus: _listen_handler(bus, tasks))
    if bus is None:
        return
    if isinstance(bus, StoreSubscriptionBus):
        bus.keep_in(coordination)
    shared.subscriptions = bus


def _listen_handler(bus: SubscriptionBus, tasks: ReplayTasks | None) -> Any:
    """The SDK's listen handler; with tasks, one also serving ``notifications.taskIds``.

    On the store's bus, a stream whose replica missed events ends with an
    error saying so (:class:`EndsOnGap`).
    """
    if tasks is None:
        handler: Any = ListenHandler(bus)
    else:
        from .tasks.listen import TaskListenHandler

        handler = TaskListenHandler(bus, tasks)
    return EndsOnGap(handler, bus) if isinstance(bus, StoreSubscriptionBus) else handler


class _ServesStreamableHTTP(Protocol):
    """``MCPServer`` and the low-level ``Server`` both have these."""

    def streamable_http_app(self, **kwargs: Any) -> Starlette: ...

    @property
    def session_manager(self) -> StreamableHTTPSessionManager: ...


def http_app(
    framework: Framework[_App],
    /,
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
    close_buffer: bool = False,
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
    collector_threshold: int | None = COLLECTOR_THRESHOLD,
    log_record_limit: int | None = LOG_RECORD_LIMIT,
    check_store: bool = True,
    metrics_path: str | None = None,
    **kwargs: Any,
) -> _App:
    """The app of ``framework``'s server, resumable through ``buffer``.

    The one signature of :func:`streamable_http_app` and
    :func:`~replaystore.mcp.fastmcp_http_app`, each of which documents it
    for its server (:func:`serving` makes them).
    """
    if "event_store" in kwargs:
        raise TypeError("pass the buffer instead of event_store")
    framework.check(kwargs)
    process = Process(drain_seconds, collector_threshold, log_record_limit, check_store)
    store = as_event_store(buffer, observer)
    settings = Settings(
        lease_ttl=lease_ttl, check_interval=check_interval, store_timeout=store_timeout
    )
    app: _App = wire(
        framework,
        store,
        settings,
        lambda: framework.build(kwargs),
        tasks=tasks,
        subscriptions=subscriptions,
        request_state=request_state,
        request_state_once=request_state_once,
        request_state_secret=request_state_secret,
        share=share,
        outer=store.buffer if close_buffer else None,
        process=process,
        metrics_path=metrics_path,
    )
    return app


_P = ParamSpec("_P")


def serving(
    framework: Callable[[Any], Framework[_App]],
    build: Callable[Concatenate[Framework[_App], _P], _App],
    name: str,
    doc: str,
) -> Callable[Concatenate[Any, _P], _App]:
    """An app builder with the signature of ``build`` (:func:`http_app`) for ``framework``.

    Its first argument is the server (wrapped once, by ``framework``), the
    others are :func:`http_app`'s: every builder takes exactly the same
    options, spelled once.
    """

    def app(server: Any, /, *args: _P.args, **kwargs: _P.kwargs) -> _App:
        return build(framework(server), *args, **kwargs)

    signature = inspect.signature(build)
    first, *rest = signature.parameters.values()
    app.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[first.replace(name="server", annotation="Any"), *rest]
    )
    app.__name__ = app.__qualname__ = name
    app.__doc__ = doc
    return app


streamable_http_app = serving(
    SDKServer,
    http_app,
    "streamable_http_app",
    """The SDK's ``server.streamable_http_app(...)``, resumable through ``buffer``.

    ``server`` is an ``MCPServer`` or a low-level ``Server``; ``kwargs`` are
    those of its ``streamable_http_app`` (``retry_interval``,
    ``streamable_http_path``, ``transport_security``, ``host`` …), except
    ``event_store``. Apps built on one buffer URL are replicas of each other,
    and share what a client can see from any of them (the module docstring
    lists it; ``share=False`` keeps the server's own ``requestState`` policy
    and listen bus). The buffer is closed when the app stops only with
    ``close_buffer=True``: otherwise close it in your own lifespan or at exit.

    ``tasks``: the :class:`~replaystore.mcp.tasks.ReplayTasks` extension given
    to the server; its tasks are kept in the buffer's store and its tools run
    while the app's lifespan is open. ``subscriptions``: a bus of your own
    for ``subscriptions/listen`` (by default a
    :class:`~replaystore.mcp.StoreSubscriptionBus`); with ``tasks``,
    listen streams also serve ``notifications.taskIds``. ``request_state``: a
    ``RequestStateSecurity`` of your own (e.g. ``keys=[secret]``) sealing
    ``requestState`` instead of the key kept in the store.
    ``request_state_secret``: the operator's secret the store's key is
    derived from (by default ``REPLAYSTORE_REQUEST_STATE_SECRET``; see
    :class:`StoreKeyRing`). Each ``requestState`` runs its round once across
    the replicas (a repeat gets the first answer again, or an error, never a
    second run); ``request_state_once=False`` accepts it until it expires, as
    the SDK does.

    The app also answers the health check at ``/healthz``
    (:func:`~replaystore.mcp.sessions.health.health_endpoint`), and with ``metrics_path``
    (e.g. ``"/metrics"``, needs ``replaystore[prometheus]``) Prometheus scrapes:
    every metric of ``prometheus_client.REGISTRY``, replaystore's
    (:mod:`replaystore.mcp.metrics`) and your own. :func:`manager_of` gives
    its session manager.

    What the app does to its process, the same as ``replaystore
    example-server`` (:class:`Process`): served by uvicorn, it drains when
    told to stop (``SIGTERM``, Ctrl-C): no new work, running requests and
    tasks go on for up to ``drain_seconds``, then what still runs is handed
    over (:mod:`~replaystore.mcp.stopping`); ``collector_threshold``: the
    garbage collector is tuned once the app started
    (:func:`~replaystore.mcp.tune_collector`, ``None`` to leave it);
    ``log_record_limit``: no log record longer than this many characters
    while it runs (``None`` to leave the log alone); ``check_store``: what
    the store must give a replica is checked once at start, each problem
    logged in one line.
    """,
)


def manager_of(app: Any) -> ReplaySessionManager:
    """The session manager of an app built by :func:`streamable_http_app` or ``fastmcp_http_app``.

    For what the wiring does not do by itself: draining under a server other
    than uvicorn (:meth:`ReplaySessionManager.drain`), a health check of your
    own (:meth:`ReplaySessionManager.health`). FastMCP builds its manager
    when the app starts: before that, this raises ``RuntimeError``.
    """
    shared = getattr(getattr(app, "state", None), "replaystore", None)
    if not isinstance(shared, Shared):
        raise TypeError("not an app built by streamable_http_app or fastmcp_http_app")
    if not shared.managers:
        raise RuntimeError("the app has not started: FastMCP builds its session manager then")
    return shared.managers[-1]


def session_managers(app: Any) -> list[StreamableHTTPSessionManager]:
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

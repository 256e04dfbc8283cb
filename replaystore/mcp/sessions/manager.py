"""The session manager: sessions live in the store, and any replica serves any of them.

The SDK's ``StreamableHTTPSessionManager`` keeps sessions in one process's
memory, so a second replica answers 404 for a session it did not create.
:class:`ReplaySessionManager` keeps the SDK's manager and changes four
things:

- each session gets its own view (:class:`~replaystore.mcp.sessions.event_store.SessionView`)
  and the :class:`~replaystore.mcp.sessions.transport.ReplayTransport`, before
  anything is stored;
- when ``initialize`` is answered, the session's record (negotiated version,
  the client's ``initialize`` parameters, the credential that created it) is
  written to the store; a replica receiving any request for a session it has
  never seen, that the store knows, **adopts** it: it builds the transport
  and the SDK's session loop with a connection already initialized from the
  record, then serves the request. A session the store does not know is 404,
  as before;
- forgetting a session here (idle timeout, shutdown, a store error) does not
  end it: it lives on in the store and on the other replicas. Only DELETE and
  a failed resumption end it everywhere;
- server-to-client request ids name this replica, so the client's answers
  can be forwarded to it from any replica.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any, cast

import anyio
import anyio.abc
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import (
    SESSION_ID_PATTERN,
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp_types import INTERNAL_ERROR, InitializeRequestParams
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ...backends.coordination import Coordination, coordination_of
from ...buffer import ReplayBuffer
from ...errors import StorageError
from ...verdicts import Verdict
from .._sdk.checked import lowlevel_server  # importing sdk checks the SDK's private names
from .._sdk.overrides import UNSERVED, ManagerOverrides, ReplicaDispatcher
from ..http_head import LAST_EVENT_ID, PROTOCOL_VERSION, SESSION_ID, Head
from ..metrics import ResumptionObserver, count_drain, time_store
from ..preflight import Problem, check_store, probe
from ..refusals import (
    answer_in_stream,
    bounded,
    read_within,
    store_trouble,
    unavailable_error,
)
from ..replicas.replica import Replica
from ..settings import DEFAULT_CHECK_INTERVAL, DEFAULT_LEASE_TTL, DEFAULT_STORE_TIMEOUT, Settings
from .error_responses import json_error, not_found, unavailable, unknown, why_gone
from .event_store import APPENDS, ReplayEventStore, SessionView, as_event_store
from .leases import STORE_UNREACHABLE, end_unanswered, stopped_by_store
from .live import Attachment
from .messages import GET_STREAM
from .sse import answer_whole
from .transport import ReplayTransport, header_text

__all__ = ["ReplaySessionManager"]

logger = logging.getLogger("replaystore.mcp")

#: Creators of sessions served from the store kept at most (then forgotten, and read again).
_OWNERS_KEPT = 10_000

#: Combinations of headers that passed the SDK's checks kept at most.
_CHECKS_KEPT = 1_000


_COMBINED: dict[type, type[ReplaySessionManager]] = {}


def _combine(theirs: type) -> type[ReplaySessionManager]:
    """The manager layered over an SDK/FastMCP manager class we did not write (cached)."""
    if issubclass(theirs, ReplaySessionManager):
        return theirs
    if theirs not in _COMBINED:
        name = f"ReplaySessionManagerOver{theirs.__name__}"
        _COMBINED[theirs] = type(name, (ReplaySessionManager, theirs), {})
    return _COMBINED[theirs]


def _view_of(transport: StreamableHTTPServerTransport) -> SessionView | None:
    """A session's view, for the transports this manager built (all but the SDK's stateless)."""
    return transport.view if isinstance(transport, ReplayTransport) else None


def _fingerprint(requestor: Any) -> str:
    """A stable digest of the credential that created a session ("" for none)."""
    if requestor is None:
        return ""
    text = json.dumps(requestor, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _valid_session_id(session_id: str) -> bool:
    """A session id the SDK could have issued (a served one was: it is not checked again)."""
    return len(session_id) <= 256 and SESSION_ID_PATTERN.fullmatch(session_id) is not None


def _requestor(scope: Scope) -> Any:
    user = scope.get("user")
    return authorization_context(user) if isinstance(user, AuthenticatedUser) else None


class ReplaySessionManager(ManagerOverrides):
    """The SDK's session manager, with sessions in the store and any replica serving any session.

    Construct it like the SDK's manager (``server`` a low-level ``Server`` or
    an ``MCPServer``), with a :class:`ReplayBuffer` (or a
    :class:`ReplayEventStore`) as the event store, and mount it yourself::

        manager = ReplaySessionManager(server, buffer, retry_interval=1000)
        app = Starlette(
            routes=[Route("/mcp", StreamableHTTPASGIApp(manager))],
            lifespan=lambda app: manager.run(),
        )

    or turn a manager someone else built into one with :meth:`adopt` (that is
    what :func:`streamable_http_app` and
    :func:`replaystore.mcp.fastmcp_http_app` do, so that the SDK's and
    FastMCP's own app wiring, auth and security settings are kept).

    ``lease_ttl`` bounds how long a client waits for the answer to a request
    whose replica stopped; ``check_interval`` how often a live connection
    re-checks the store (lost notifications, lapsed leases); ``store_timeout``
    how long a request waits for an unresponsive store before it is answered
    503 with ``Retry-After``.
    """

    _replay_store: ReplayEventStore
    _replica: Replica
    _adopting: dict[str, anyio.Lock]
    #: The SDK transport's host and origin checks, for requests answered without one.
    _guard: TransportSecurityMiddleware
    _replicating: bool
    #: Whether :meth:`check_store` ran (the example server runs it before it serves).
    store_checked: bool

    def __init__(
        self,
        app: Any,
        event_store: ReplayEventStore | ReplayBuffer,
        *,
        observer: ResumptionObserver | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        store_timeout: float = DEFAULT_STORE_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        store = as_event_store(event_store, observer)
        settings = Settings(
            lease_ttl=lease_ttl, check_interval=check_interval, store_timeout=store_timeout
        )
        # An MCPServer wraps the low-level Server the SDK's manager drives.
        # Each session's transport gets its own event store (new_transport):
        # the SDK's manager is given none.
        super().__init__(lowlevel_server(app), **kwargs)
        self._setup(store, settings, coordination_of(store.buffer.backend))

    def _setup(
        self, store: ReplayEventStore, settings: Settings, coordination: Coordination
    ) -> None:
        self._replay_store = store
        session_ttl = store.buffer.retention.session_ttl
        self._replica = Replica(coordination, self, settings, session_ttl=session_ttl)
        self._adopting = {}
        #: The creator (fingerprint) of each session a resume read from the store.
        self._store_owners: dict[str, str] = {}
        #: The (Accept, Host, Origin) of resumes the SDK's checks let through.
        self._checked: set[tuple[str | None, str | None, str | None]] = set()
        self._guard = TransportSecurityMiddleware(self.security_settings)
        self._replicating = False
        self.store_checked = False

    @classmethod
    def adopt(
        cls,
        manager: StreamableHTTPSessionManager,
        store: ReplayEventStore,
        settings: Settings | None = None,
        coordination: Coordination | None = None,
    ) -> ReplaySessionManager:
        """Make an existing manager (SDK's or a subclass, e.g. FastMCP's) serve ``store``.

        Changes the instance's class in place: the SDK's ``streamable_http_app``
        builds its manager inline and hands that very object to both the route
        and the lifespan, and FastMCP enters its manager's ``run()`` (which
        enters the server's lifespan) before it can be adopted, so another
        object could not take its place without rebuilding the whole app or
        running the server's lifespan twice. Must run before the first
        request. ``settings`` (:class:`~replaystore.mcp.settings.Settings`)
        times the replica; the defaults when omitted. ``coordination``: the
        store's (:func:`~replaystore.backends.coordination.coordination_of`
        its backend when omitted).
        """
        if coordination is None:
            coordination = coordination_of(store.buffer.backend)
        manager.__class__ = _combine(type(manager))
        adopted = cast(ReplaySessionManager, manager)
        cls._setup(adopted, store, settings if settings is not None else Settings(), coordination)
        return adopted

    @property
    def replica(self) -> Replica:
        return self._replica

    @property
    def sessions_open(self) -> int:
        """Sessions this replica serves now (its copies: every session lives in the store)."""
        return len(self._server_instances)

    # ---------------------------------------------------------------- lifecycle

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        async with super().run(), self.replicating():
            yield

    @asynccontextmanager
    async def replicating(self) -> AsyncIterator[None]:
        """Take part in the replica set while the app runs (entered by :meth:`run`).

        For a manager whose ``run()`` was entered before it was adopted
        (FastMCP's), enter this right after adopting it.
        """
        if self._replicating:
            yield
            return
        self._replicating = True
        try:
            async with self._replica.run():
                if not self.store_checked:
                    self._replica.spawn(self._check_quietly)
                yield
        finally:
            self._replicating = False
            # Stop serving here, promptly: the sessions live on in the store.
            for session_id, transport in list(self._server_instances.items()):
                self._server_instances.pop(session_id, None)
                view = _view_of(transport)
                if view is not None:
                    view.close_local()

    # ---------------------------------------------------------------- draining, health

    @property
    def draining(self) -> bool:
        return self._replica.draining

    def drain(self) -> None:
        """Stop taking new work: the process is about to stop (on ``SIGTERM``).

        An app built by the wiring calls it when uvicorn is told to stop
        (:mod:`replaystore.mcp.stopping`); under another server, call it
        yourself (:func:`~replaystore.mcp.manager_of`).

        From now on :meth:`health` says so (a balancer takes the replica out
        of rotation), new requests are answered 503 with ``Retry-After`` (a
        balancer retries them on another replica), and the standalone GET
        streams served here are closed (their clients resume them, exactly,
        on another replica). Requests already running here go on, and their
        clients' resumptions are still served, until the server stops; then
        whatever still runs is handed over as a replica that stopped is.
        """
        if not self._replica.draining:
            count_drain("started")
        self._replica.draining = True
        for transport in list(self._server_instances.values()):
            view = _view_of(transport)
            if view is not None:
                view.live.close_stream(GET_STREAM)

    async def health(self) -> tuple[bool, str]:
        """``(True, "ok: replica <id>")`` when this replica takes work (not draining, store serves).

        The store is asked what requests need, within ``store_timeout``: a
        write (a lease taken and dropped), a script, a publish
        (:func:`~replaystore.mcp.preflight.probe`); after a refusal that
        waiting cannot cure (the ACL), the commands of a whole session too,
        until the store grants them again.
        """
        replica = self._replica
        if replica.draining:
            return False, "draining: this replica is shutting down"
        try:
            with bounded(replica.settings.store_timeout):
                # Deep (a session opened and appended to, as requests do) while
                # appends fail, and whenever writes must reach replicas
                # (wait_replicas): a store that answers but cannot store or
                # replicate what requests write is no healthy one.
                buffer = self._replay_store.buffer
                durable = bool(getattr(buffer.backend, "wait_replicas", 0))
                deep = replica.refused is not None or APPENDS.failing or durable
                started = time.perf_counter()
                try:
                    await probe(
                        buffer, replica.coordination, replica.registry, replica.id, deep=deep
                    )
                finally:
                    time_store("health", time.perf_counter() - started)
        except StorageError as exc:
            if exc.permanent:
                replica.refused = exc
            return False, f"{store_trouble(exc)}; this replica cannot serve"
        replica.refused = None
        if APPENDS.failing:
            APPENDS.succeeded()
        return True, f"ok: replica {replica.id}"

    async def _check_quietly(self) -> None:
        try:
            await self.check_store()
        except Exception as exc:  # a check must never stop the replica
            logger.warning("replaystore: the store could not be checked: %s", exc)

    async def check_store(self) -> list[Problem]:
        """Check once what the store must give this replica, and log each problem in one line.

        Run in the background when the replica starts (unless already done:
        :attr:`store_checked`); a refusal that waiting cannot cure (the ACL)
        also makes the health check fail until it is fixed.
        """
        self.store_checked = True
        problems = await check_store(self._replay_store.buffer, self._replica.coordination)
        for problem in problems:
            if problem.fatal:
                logger.error("replaystore: %s", problem.text)
            else:
                logger.warning("replaystore: %s", problem.text)
        if any(problem.fatal for problem in problems):
            # The health check asks the deep questions until they pass.
            self._replica.refused = StorageError("refused at start-up", permanent=True)
        return problems

    # ---------------------------------------------------------------- requests

    # (called by the overrides of the SDK's private methods, in overrides.py)

    async def answer_resume(self, head: Head, scope: Scope, receive: Receive, send: Send) -> bool:
        """:meth:`answer_unserved` for the resume lane, which reaches it before the SDK's entry.

        Only where that entry would have come to it: a stateful manager that
        runs, and a protocol version its session transport speaks (the SDK
        sends any other to its own handler). Otherwise, and when it leaves
        the request to the SDK, False: the request goes the usual way.
        """
        if self.stateless or self._task_group is None:
            return False
        version = head.text(PROTOCOL_VERSION)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return False
        if await self._answer_unserved(head, scope, receive, send):
            return True
        scope[UNSERVED] = True
        return False

    async def answer_unserved(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer what needs no SDK session; adopt a session the store knows before the SDK
        looks it up in this process."""
        return await self._answer_unserved(Head(scope), scope, receive, send)

    async def _answer_unserved(
        self, head: Head, scope: Scope, receive: Receive, send: Send
    ) -> bool:
        session_id = head.text(SESSION_ID)
        if session_id is None:
            return False
        served = self._transport(session_id)
        refused = None
        try:
            read = await self._resume_from_store(head, scope, receive, session_id, served, send)
            if read is True:
                return True
            if session_id not in self._server_instances:
                known = read.record if isinstance(read, _Read) else None
                refused = await self._adopt_session(session_id, _requestor(scope), known)
            transport = self._transport(session_id)
            view = transport.view if transport is not None else None
            if isinstance(read, _Read) and refused is None and view is not None:
                view.live.pending = (read.cursor, read.attachment)
        except StorageError as exc:
            logger.warning(
                "session %s cannot be looked up: %s", session_id[:64], store_trouble(exc)
            )
            await _unavailable(exc)(scope, receive, send)
            return True
        if refused is not None:
            await refused(scope, receive, send)
            return True
        return await self._not_found(session_id, scope, receive, send)

    async def _not_found(self, session_id: str, scope: Scope, receive: Receive, send: Send) -> bool:
        """404 for a session this replica will not serve, with the verdict and why it ended.

        Where the SDK would answer a bare "Session not found": a session
        nobody serves (the store ended it, lost it, or never had it), one
        terminated here a moment ago, and one asked for with another
        credential than its creator's (answered exactly as one that never
        existed). False when the SDK serves the request.
        """
        served = self._server_instances.get(session_id)
        if served is not None and not served.is_terminated:
            if _requestor(scope) == self._session_owners.get(session_id):
                return False
            logger.warning(
                "Rejecting request for session %s: credential does not match the one that "
                "created the session",
                session_id[:64],
            )
            gone = unknown(session_id)
        else:
            logger.info("Rejected request with unknown or ended session ID: %s", session_id[:64])
            gone = await why_gone(
                self._replay_store.buffer, session_id, self._replica.settings.store_timeout
            )
        await not_found(None, gone)(scope, receive, send)
        return True

    async def _resume_from_store(
        self,
        head: Head,
        scope: Scope,
        receive: Receive,
        session_id: str,
        served: ReplayTransport | None,
        send: Send,
    ) -> bool | _Read | None:
        """A resume answered from the store alone when its replay is the whole answer.

        A reconnecting client usually resumes a stream whose response is
        stored (its call ended while it was away): the replay is then the
        whole answer, which needs none of the SDK's request machinery, and on
        a replica that does not serve the session, none of its session (a
        transport, a message loop) built only to be idle. So such a resume
        is checked as the SDK checks a GET (host and origin, ``Accept``, the
        credential that created the session; and the session's record when
        it is not served here), resolved, and answered: the replay, or the
        failed verdict. True when answered; otherwise what was read, for the
        session's resume to go on from (a stream that goes on live), or None
        (the usual path).
        """
        cursor = head.text(LAST_EVENT_ID)
        if (
            scope["method"] != "GET"
            or not cursor
            or (served is None and not _valid_session_id(session_id))
            or not await self._passes_sdk_checks(head)
        ):
            return None
        replica = self._replica
        requestor = _requestor(scope)
        record = None
        if served is not None:
            view = served.view
            if (
                view is None
                or view.closed
                or served.is_terminated
                or requestor != self._session_owners.get(session_id)
            ):
                return None  # the usual path answers it
        else:
            # A session's creator never changes: once read, its record need not be
            # read again to check it. Whether the session still lives, the resume's
            # own read says (a session that ended is unknown there, as here).
            owner = self._store_owners.get(session_id)
            if owner is None:
                with read_within(replica.settings.store_timeout):
                    record = await replica.registry.get_session(session_id)
                if record is None:
                    return None  # the usual path answers it (and logs why)
                owner = record.get("owner", "")
                if len(self._store_owners) >= _OWNERS_KEPT:
                    self._store_owners.clear()
                self._store_owners[session_id] = owner
            if owner != _fingerprint(requestor):
                return None  # the usual path answers it (and logs why)
            view = self._replay_store.for_session(session_id, replica)
            view.adopted(record or {})
        cursor = header_text(cursor)
        try:
            with read_within(replica.settings.store_timeout):
                attachment = await view.live.read(cursor)
        except StorageError as exc:
            if exc.permanent:
                replica.refused = exc
            message, data = unavailable_error(exc, resumption=True)
            await unavailable(session_id, message, data)(scope, receive, send)
            return True
        if attachment.ok and not attachment.finished:
            return _Read(cursor, attachment, record)
        if attachment.ok:
            await answer_whole(send, session_id, attachment.replay)
            return True
        if served is not None:
            await served.fail_closed(attachment.resumption, Request(scope, receive), send)
            return True
        if attachment.resumption.verdict is Verdict.UNKNOWN_SESSION:
            return None  # nothing to end; the usual path answers it
        await view.end_everywhere(failed=True)
        await not_found(session_id, attachment.resumption)(scope, receive, send)
        return True

    async def _passes_sdk_checks(self, head: Head) -> bool:
        """Whether the SDK would let this GET through: ``Accept``, then host and origin.

        Both checks are the SDK's own, and depend on those three headers only:
        each combination that passed is kept, so a client's resumes run them
        once (at most :data:`_CHECKS_KEPT` kept, then forgotten and run again).
        """
        key = (head.text(b"accept"), head.text(b"host"), head.text(b"origin"))
        if key in self._checked:
            return True
        # The SDK's checks read only ``headers.get`` of the request: the head serves.
        request = cast(Request, head)
        if (
            not check_accept_headers(request)[1]
            or await self._guard.validate_request(request, is_post=False) is not None
        ):
            return False
        if len(self._checked) >= _CHECKS_KEPT:
            self._checked.clear()
        self._checked.add(key)
        return True

    async def _adopt_session(
        self, session_id: str, requestor: Any, known: dict[str, str] | None = None
    ) -> Response | None:
        """Serve a session created elsewhere, if the store knows it (else the SDK answers 404).

        ``known``: its record, read already and proven live by a resume that
        the store just answered, so neither is read again.
        """
        if not _valid_session_id(session_id):
            return None
        lock = self._adopting.setdefault(session_id, anyio.Lock())
        try:
            async with lock:
                if session_id in self._server_instances:
                    return None
                registry, replica = self._replica.registry, self._replica.id
                record, live = known, known is not None
                if record is None:
                    with bounded(self._replica.settings.store_timeout):
                        # Read as this replica is named in it, so that the
                        # session's end is told here (a replica that then
                        # refuses the session ignores that end).
                        record = await registry.hold(session_id, replica)
                        # The record and the events end together; if the events
                        # are gone (expired, torn down) the record is stale.
                        live = record is not None and (
                            await self._replay_store.buffer.session_info(session_id) is not None
                        )
                if record is None:
                    return None
                if not live:
                    await self._replica.registry.drop_session(session_id)
                    return None
                if record.get("owner", "") != _fingerprint(requestor):
                    logger.warning(
                        "not adopting session %s: the credential differs from its creator's",
                        session_id[:64],
                    )
                    return None
                if known is not None:
                    with bounded(self._replica.settings.store_timeout):
                        # Named in the record as above; no record left: it just ended.
                        if await registry.hold(session_id, replica) is None:
                            return None
                transport = self._admit_session(requestor, session_id)
                if transport is None:
                    return json_error(
                        None,
                        HTTPStatus.SERVICE_UNAVAILABLE,
                        INTERNAL_ERROR,
                        "Too many open sessions",
                        None,
                    )
                cast(ReplayTransport, transport).view.adopted(record)
                assert self._task_group is not None
                await self._task_group.start(partial(self.run_session, transport, record))
                logger.info("adopted session %s from the store", session_id)
                return None
        finally:
            if not lock.locked():
                self._adopting.pop(session_id, None)

    def new_transport(self, session_id: str, requestor: Any) -> ReplayTransport:
        """A session's transport (new or adopted), with its own view before anything is stored."""
        host = _Hosted(self, session_id)
        view = self._replay_store.for_session(session_id, self._replica, host)
        view.owner = _fingerprint(requestor)
        transport = ReplayTransport(
            view,
            mcp_session_id=session_id,
            is_json_response_enabled=self.json_response,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        host.transport = transport
        self._replica.followers[session_id] = view.live
        return transport

    async def run_session(
        self,
        transport: StreamableHTTPServerTransport,
        record: dict[str, str] | None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The SDK's session loop, rebuilt in its initialized state when adopted from ``record``."""
        session_id = transport.mcp_session_id
        assert session_id is not None
        async with transport.connect() as (read_stream, write_stream):
            task_status.started()
            try:
                idle_scope = transport.idle_scope or anyio.CancelScope()
                with idle_scope:
                    dispatcher = ReplicaDispatcher(
                        read_stream, write_stream, inline_methods=frozenset({"initialize"})
                    )
                    dispatcher.replica = self._replica.id
                    connection = Connection.for_loop(dispatcher, session_id=session_id)
                    if record is not None:
                        _restore(connection, record)
                    view = _view_of(transport)
                    if view is not None:
                        view.connection = connection
                    await serve_connection(
                        self.app,
                        dispatcher,
                        connection=connection,
                        lifespan_state=self._lifespan_state,
                    )
                if idle_scope.cancelled_caught:
                    logger.info("session %s idle here; it lives on in the store", session_id)
            except Exception:
                logger.exception("session %s crashed", session_id)
            finally:
                await self._discard_session(session_id, transport)

    def discarded(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        """Forgotten in this process only: the session lives on in the store and elsewhere."""
        view = _view_of(transport)
        if view is not None:
            view.close_local()
            if self._replica.followers.get(session_id) is view.live:
                del self._replica.followers[session_id]
            self._replica.release_session(session_id)

    async def forget(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        """Forget a session in this process only: it lives on in the store and elsewhere."""
        await self._discard_session(session_id, transport)

    def session_failed(
        self, session_id: str, transport: StreamableHTTPServerTransport, exc: BaseException
    ) -> None:
        """A session's append failed: its requests here end, and the session is forgotten here."""
        if isinstance(exc, StorageError):
            # Its requests stopped for the store, not for a replica: say so,
            # in the store's words when it answered (out of memory, ...).
            unreachable = exc.kind == "unreachable"
            message = STORE_UNREACHABLE if unreachable else stopped_by_store(store_trouble(exc))
            self._replica.end_after_outage(session_id, message)
        self._replica.spawn(self.forget, session_id, transport)
        if self._task_group is not None and not self._replica.running:
            self._task_group.start_soon(self.forget, session_id, transport)

    # ---------------------------------------------------------------- other replicas
    # (the replica's Sessions protocol: what other replicas tell this process)

    async def end_request(self, session: str, stream: str, message: str) -> None:
        """Store ``message`` as the error response of a request that stopped unanswered."""
        await end_unanswered(self._replay_store.buffer, self._replica, session, stream, message)

    def _transport(self, session_id: str) -> ReplayTransport | None:
        transport = self._server_instances.get(session_id)
        return transport if isinstance(transport, ReplayTransport) else None

    def ended_elsewhere(self, session: str) -> None:
        """``session`` ended on another replica: forget it here."""
        transport = self._transport(session)
        if transport is not None:
            self._replica.spawn(self._discard_session, session, transport)

    def forwarded(self, session: str, body: str) -> None:
        """A client message for a request of ``session`` running here enters its loop."""
        transport = self._transport(session)
        if transport is None:
            logger.info("forwarded message for session %s, which is not served here", session)
            return
        self._replica.spawn(transport.deliver_forwarded, body)

    def taken_over(self, session: str, stream: str) -> None:
        """A newer connection took ``stream`` over: close the one carrying it here."""
        transport = self._transport(session)
        if transport is not None:
            view = transport.view
            if view is not None:
                view.live.close_stream(stream)
            transport.close_sdk_stream(stream)


@dataclass(frozen=True, slots=True)
class _Read:
    """A resume read before its session is served here: the rest follows from it."""

    cursor: str
    attachment: Attachment
    #: The session's record, when it was read for the resume (not served here).
    record: dict[str, str] | None


class _Hosted:
    """How one session's view reports to the manager (its :class:`SessionHost`)."""

    def __init__(self, manager: ReplaySessionManager, session_id: str) -> None:
        self.manager = manager
        self.session_id = session_id
        #: Set once built (the transport is built with the view that reports here).
        self.transport: ReplayTransport | None = None

    async def discard(self) -> None:
        if self.transport is not None:
            await self.manager.forget(self.session_id, self.transport)

    async def refused(self, stream: str, exc: StorageError) -> bool:
        return self.transport is not None and await answer_in_stream(self.transport, stream, exc)

    def failed(self, exc: BaseException) -> None:
        if self.transport is not None:
            self.manager.session_failed(self.session_id, self.transport, exc)


def _restore(connection: Connection, record: dict[str, str]) -> None:
    """The connection state ``initialize`` left on the replica that created the session."""
    connection.protocol_version = record.get("version") or connection.protocol_version
    client = record.get("client")
    if client:
        connection.client_params = InitializeRequestParams.model_validate_json(
            client, by_name=False
        )
    connection.initialized.set()


def _unavailable(exc: StorageError) -> Response:
    return unavailable(None, *unavailable_error(exc))

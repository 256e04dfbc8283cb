"""Fail-closed resumption over the SDK's streamable HTTP transport.

The stock SDK (``mcp`` 2.3) has three gaps this module closes, with the
smallest overrides that do it:

1. **Silent 200.** ``_replay_events`` starts the SSE response (status 200)
   *before* it asks the store, so an unknown or evicted ``Last-Event-ID``
   yields an empty 200 that the SDK client retries forever. Here the atomic
   ``resolve_and_replay`` runs first; anything but ``resumed`` answers 404 with
   the verdict and its evidence in a JSON-RPC error, after tearing the session
   down in the store (``resolve_and_replay`` did that atomically) *and* in this
   process (the manager forgets it, the transport is terminated), so every
   later request with that id gets 404. A store that cannot be reached gives
   503: the verdict is unknown, the session is kept.
2. **Replay-to-live seam.** The SDK snapshots the replay, then registers the
   live queue: events produced in between are lost, and a stream still live
   on an older connection keeps feeding the old one. Here the snapshot, the
   takeover and the registration of the live feed are one step under the
   session's store lock (see :mod:`replaystore.mcp.store`). DECISION: *the
   newest connection takes over* a stream: the older connection carrying it is
   closed, and every later event goes to the new connection only. A client
   that resumes says "I hold everything up to this id"; keeping the old
   connection alive would send later events to a connection the client may
   have given up on, while the new one waits.
3. **GET stream.** Standalone messages stored while no GET is attached were
   never delivered. DECISION: the session remembers the last GET-stream event
   handed to a GET connection (or an anchor stored before the first one); a
   plain GET that finds messages stored after it resumes from there (replay,
   then live), and fails closed (404) like any resumption when continuity
   cannot be proven. Every GET carries a priming event in position order
   (first when nothing is replayed, right after the replay otherwise), so the
   client always holds a resumable cursor for the GET stream. A second GET
   takes the stream over instead of getting the SDK's 409.

Clients on protocol 2026-07-28 never reach this code: the manager routes them
to the SDK's single-exchange transport, which has no sessions to resume.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, Protocol, TypeVar, cast

import anyio
from mcp.server.streamable_http import (
    CONTENT_TYPE_JSON,
    CONTENT_TYPE_SSE,
    GET_STREAM_KEY,
    LAST_EVENT_ID_HEADER,
    MCP_SESSION_ID_HEADER,
    EventMessage,
    SSEEvent,
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    JSONRPCError,
    JSONRPCResponse,
)
from mcp_types.version import is_version_at_least
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Send

from ..buffer import ReplayBuffer
from ..errors import StorageError, UnknownSessionError
from ..verdicts import Resumption
from .metrics import ResumptionObserver
from .store import Attachment, ReplayEventStore, SessionEventStore, _vanished

__all__ = [
    "ReplaySessionManager",
    "ReplayTransport",
    "streamable_http_app",
]

logger = logging.getLogger("replaystore.mcp")

#: First protocol revision whose clients understand priming events.
PRIMING_SINCE = "2025-11-25"

_T = TypeVar("_T")
_COMBINED: dict[tuple[type, type], type] = {}


def _combine(ours: type[_T], theirs: type) -> type[_T]:
    """``ours`` layered over an SDK/FastMCP subclass we did not write (cached per pair)."""
    if issubclass(theirs, ours):
        return theirs
    key = (ours, theirs)
    if key not in _COMBINED:
        _COMBINED[key] = type(f"{ours.__name__}Over{theirs.__name__}", (ours, theirs), {})
    return cast(type[_T], _COMBINED[key])


def as_event_store(
    store: ReplayEventStore | ReplayBuffer, observer: ResumptionObserver | None = None
) -> ReplayEventStore:
    """Accept a buffer or an already-built store (then ``observer`` must not be given twice)."""
    if isinstance(store, ReplayEventStore):
        if observer is not None and store.observer is not observer:
            raise ValueError("pass the observer to ReplayEventStore(...), not twice")
        return store
    if isinstance(store, ReplayBuffer):
        return ReplayEventStore(store, observer=observer)
    raise TypeError(f"expected a ReplayBuffer or ReplayEventStore, not {type(store).__name__}")


class ReplayTransport(StreamableHTTPServerTransport):
    """The SDK transport with fail-closed resumption, an exact seam and a kept GET stream.

    It has no ``__init__`` and no state of its own (the per-session state is
    in its :class:`SessionEventStore`), so that the session manager can keep
    the SDK's own construction of the transport and only change its class.
    Everything that is not a GET is the SDK's code, unchanged.
    """

    @property
    def replay_store(self) -> SessionEventStore | None:
        store = self._event_store
        return store if isinstance(store, SessionEventStore) else None

    # ------------------------------------------------------------ overrides

    async def _handle_get_request(self, request: Request, send: Send) -> None:
        """Plain GETs attach through the store; everything else is the SDK's path."""
        view = self.replay_store
        _, has_sse = check_accept_headers(request)
        if view is None or not has_sse or request.headers.get(LAST_EVENT_ID_HEADER):
            # Validation errors, and GET + Last-Event-ID (-> _replay_events below).
            await super()._handle_get_request(request, send)
            return
        if not await self._validate_request_headers(request, send):
            return
        prime = _primes(request)
        await self._attach(
            lambda: view.attach_get(prime=prime, on_takeover=self._close_sdk_stream),
            request,
            send,
            prime,
        )

    async def _replay_events(self, last_event_id: str, request: Request, send: Send) -> None:
        """Resolve first, answer after: 404 + verdict on failure, never an empty 200."""
        view = self.replay_store
        if view is None:  # pragma: no cover - only with a foreign event store
            await super()._replay_events(last_event_id, request, send)
            return
        prime = _primes(request)
        await self._attach(
            lambda: view.attach_resume(
                last_event_id, prime=prime, on_takeover=self._close_sdk_stream
            ),
            request,
            send,
            prime,
        )

    def close_sse_stream(self, request_id: Any) -> None:
        """Also end the connection when the stream is carried by one of ours (a resumed one)."""
        super().close_sse_stream(request_id)
        view = self.replay_store
        if view is not None:
            view.close_stream(str(request_id))

    async def terminate(self) -> None:
        await super().terminate()
        view = self.replay_store
        if view is not None:
            view.close_all_streams()

    # ------------------------------------------------------------ internals

    def _close_sdk_stream(self, stream: str) -> None:
        """Takeover: close the SDK-owned connection of ``stream`` (original POST), if any."""
        super().close_sse_stream(stream)  # the next class in the MRO, not our override

    async def _attach(
        self,
        attach: Callable[[], Awaitable[Attachment]],
        request: Request,
        send: Send,
        prime: bool,
    ) -> None:
        try:
            attachment = await attach()
        except StorageError:
            await self._json_error(
                request,
                send,
                HTTPStatus.SERVICE_UNAVAILABLE,
                INTERNAL_ERROR,
                "Service Unavailable: the replay store cannot be reached; the resumption "
                "verdict is unknown, retry later",
                {"verdict": None, "reason": "storage_error"},
                extra_headers={"Retry-After": "1"},
            )
            return
        except UnknownSessionError:
            assert self.mcp_session_id is not None
            attachment = Attachment(_vanished(self.mcp_session_id))
        except Exception:
            logger.exception("error while resuming session %s", self.mcp_session_id)
            await self._json_error(
                request,
                send,
                HTTPStatus.INTERNAL_SERVER_ERROR,
                INTERNAL_ERROR,
                "Error replaying events",
                None,
            )
            return
        if not attachment.ok:
            await self._fail_closed(attachment.resumption, request, send)
            return
        await self._stream(attachment, request, send, prime)

    async def _fail_closed(self, resumption: Resumption, request: Request, send: Send) -> None:
        """Tear the session down here too, then answer 404 with the verdict and its evidence."""
        view = self.replay_store
        if view is not None and view.discard is not None:
            await view.discard()
        else:
            with anyio.CancelScope(shield=True):
                await self.terminate()
                if view is not None:
                    await view.close()
        await self._json_error(
            request,
            send,
            HTTPStatus.NOT_FOUND,
            INVALID_REQUEST,
            f"Not Found: cannot resume ({resumption.verdict.value}: "
            f"{resumption.evidence.reason}); the session was terminated, "
            "initialize a new one",
            {"verdict": resumption.verdict.value, "evidence": resumption.evidence.as_dict()},
        )

    async def _json_error(
        self,
        request: Request,
        send: Send,
        status: HTTPStatus,
        code: int,
        message: str,
        data: dict[str, Any] | None,
        *,
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        body = {"jsonrpc": "2.0", "id": None, "error": error}
        headers = {"Content-Type": CONTENT_TYPE_JSON, **(extra_headers or {})}
        if self.mcp_session_id:
            headers[MCP_SESSION_ID_HEADER] = self.mcp_session_id
        response = Response(json.dumps(body, default=str), status_code=int(status), headers=headers)
        await response(request.scope, request.receive, send)

    async def _stream(
        self, attachment: Attachment, request: Request, send: Send, prime: bool
    ) -> None:
        """Send the replay, then the live tail (deduplicated by position), as one SSE response."""
        view = self.replay_store
        assert view is not None
        tail = attachment.tail
        stream = attachment.stream
        ends_with_response = stream != GET_STREAM_KEY
        headers = {
            "Cache-Control": "no-cache, no-transform",
            "Connection": "keep-alive",
            "Content-Type": CONTENT_TYPE_SSE,
        }
        if self.mcp_session_id:
            headers[MCP_SESSION_ID_HEADER] = self.mcp_session_id
        writer, reader = anyio.create_memory_object_stream[SSEEvent](0)

        # Cancelled by a takeover, an overflow, close_sse_stream or the session's end.
        scope = tail.scope if tail is not None else anyio.CancelScope()

        async def sender() -> None:
            try:
                async with writer:
                    with scope:
                        for position, event in attachment.replay:
                            await writer.send(self._create_event_data(event))
                            if tail is not None:
                                view.delivered(tail, position, cast(str, event.event_id))
                            if ends_with_response and _is_response(event):
                                return
                        if tail is None:  # the stream was finished before this connection
                            return
                        async for live in tail.receive:
                            if live.position <= attachment.threshold:
                                continue  # already in the replay snapshot
                            if live.message is None:
                                if not prime:
                                    continue
                                data: SSEEvent = {"id": live.event_id, "data": ""}
                                if self._retry_interval is not None:
                                    data["retry"] = self._retry_interval
                            else:
                                data = self._create_event_data(
                                    EventMessage(live.message, live.event_id)
                                )
                            await writer.send(data)
                            view.delivered(tail, live.position, live.event_id)
                            if ends_with_response and isinstance(
                                live.message, JSONRPCResponse | JSONRPCError
                            ):
                                return
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                logger.debug("resumed SSE stream %r closed", stream)
            except Exception:
                logger.exception("error in the SSE writer of stream %r", stream)
            finally:
                if tail is not None:
                    view.detach(tail)

        response = EventSourceResponse(content=reader, data_sender_callable=sender, headers=headers)
        try:
            await response(request.scope, request.receive, send)
        except Exception:  # pragma: no cover - mirrors the SDK's guard
            logger.exception("error in the SSE response of stream %r", stream)
        finally:
            await writer.aclose()
            await reader.aclose()
            if tail is not None:
                view.detach(tail)


def _primes(request: Request) -> bool:
    version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
    return is_version_at_least(version, PRIMING_SINCE)


def _is_response(event: EventMessage) -> bool:
    return isinstance(event.message, JSONRPCResponse | JSONRPCError)


class ReplaySessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, giving each session a store view and a :class:`ReplayTransport`.

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
    """

    _replay_store: ReplayEventStore

    def __init__(
        self,
        app: Any,
        event_store: ReplayEventStore | ReplayBuffer,
        *,
        observer: ResumptionObserver | None = None,
        **kwargs: Any,
    ) -> None:
        store = as_event_store(event_store, observer)
        # An MCPServer wraps the low-level Server the SDK's manager drives.
        lowlevel = getattr(app, "_lowlevel_server", app)
        super().__init__(lowlevel, event_store=store, **kwargs)
        self._replay_store = store

    @classmethod
    def adopt(
        cls, manager: StreamableHTTPSessionManager, store: ReplayEventStore | None = None
    ) -> ReplaySessionManager:
        """Make an existing manager (SDK's or a subclass, e.g. FastMCP's) serve ``store``.

        Changes the instance's class in place: the SDK's ``streamable_http_app``
        builds its manager inline and hands that very object to both the route
        and the lifespan, so replacing the object is not possible without
        rebuilding the whole app. The new class only adds overrides, no state
        beyond ``_replay_store``. Must run before the first request.
        """
        if store is None:
            found = getattr(manager, "_shared_event_store", None) or manager.event_store
            if not isinstance(found, ReplayEventStore):
                raise TypeError("the manager was not built with a ReplayEventStore")
            store = found
        manager.__class__ = _combine(cls, type(manager))
        adopted = cast(ReplaySessionManager, manager)
        adopted._replay_store = store
        return adopted

    @property
    def replay_store(self) -> ReplayEventStore:
        return self._replay_store

    def _admit_session(self, requestor: Any) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None:
            self._bind(transport)
        return transport

    def _bind(self, transport: StreamableHTTPServerTransport) -> None:
        """Give a new session's transport its own store view, before any event is stored.

        The transport is built by the SDK (arguments vary between versions);
        only its class is changed, to :class:`ReplayTransport` layered over
        whatever class it had.
        """
        session_id = transport.mcp_session_id
        assert session_id is not None
        view = self._replay_store.for_session(session_id)

        async def discard() -> None:
            await self._discard_session(session_id, transport)

        def on_failure(exc: BaseException) -> None:
            task_group = getattr(self, "_task_group", None)
            if task_group is not None:
                task_group.start_soon(discard)

        view.discard = discard
        view.on_failure = on_failure
        transport._event_store = view
        transport.__class__ = _combine(ReplayTransport, type(transport))

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        """The SDK's discard (forget the id, terminate), then close the session in the store."""
        await super()._discard_session(session_id, transport)
        view = transport._event_store
        if isinstance(view, SessionEventStore):
            await view.close()


class _ServesStreamableHTTP(Protocol):
    """``MCPServer`` and the low-level ``Server`` both have these."""

    def streamable_http_app(self, **kwargs: Any) -> Starlette: ...

    @property
    def session_manager(self) -> StreamableHTTPSessionManager: ...


def streamable_http_app(
    server: Any,
    buffer: ReplayBuffer | ReplayEventStore,
    *,
    observer: ResumptionObserver | None = None,
    **kwargs: Any,
) -> Starlette:
    """The SDK's ``server.streamable_http_app(...)``, resumable through ``buffer``.

    ``server`` is an ``MCPServer`` or a low-level ``Server``; ``kwargs`` are
    those of its ``streamable_http_app`` (``retry_interval``,
    ``streamable_http_path``, ``transport_security``, ``host`` …), except
    ``event_store``. The buffer is not closed by the app: close it in your own
    lifespan or at exit.
    """
    if "event_store" in kwargs:
        raise TypeError("pass the buffer instead of event_store")
    store = as_event_store(buffer, observer)
    typed = cast(_ServesStreamableHTTP, server)
    app = typed.streamable_http_app(event_store=store, **kwargs)
    ReplaySessionManager.adopt(typed.session_manager, store)
    return app

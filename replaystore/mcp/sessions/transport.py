"""Fail-closed resumption, live tails from the store, and forwarding, over the SDK's transport.

The stock SDK (``mcp`` 2.3) transport is kept for everything it does right;
this package closes its gaps (the hooks into the SDK's private methods are in
:mod:`replaystore.mcp._sdk.overrides`, the answers here):

1. **Silent 200.** ``_replay_events`` starts the SSE response (status 200)
   *before* it asks the store, so an unknown or evicted ``Last-Event-ID``
   yields an empty 200 that the SDK client retries forever. Here the atomic
   ``resolve_and_replay`` runs first; anything but ``resumed`` answers 404 with
   the verdict and its evidence in a JSON-RPC error, after ending the session
   in the store and on every replica, so every later request with that id
   gets 404. A store that cannot be reached gives 503: the verdict is
   unknown, the session is kept.
2. **Replay-to-live seam, on any replica.** A resumed (or GET) connection is
   fed from the store by a :class:`~replaystore.mcp.sessions.tail.Tail`, whichever
   replica appends: replay, then every later event of the stream exactly
   once, in position order. DECISION: *the newest connection takes over* a
   stream: the connection carrying it before (here or on another replica)
   is closed. A client that resumes says "I hold everything up to this id";
   keeping the old connection would send later events to a connection the
   client may have given up on.
3. **GET stream.** Standalone messages stored while no GET is attached are
   delivered to the next GET (see
   :meth:`~replaystore.mcp.sessions.live.LiveStreams.attach_get`); every GET
   carries a priming event in position order; a second GET takes the stream
   over instead of getting the SDK's 409.
4. **Requests run where they land.** A POSTed request takes a lease on its
   stream before it runs; the client's answers to another replica's requests
   (and cancellations of requests running elsewhere) are forwarded to that
   replica (:mod:`replaystore.mcp.replicas.forwarding`).

Clients on protocol 2026-07-28 never reach this code: the manager routes them
to the SDK's single-exchange transport, which has no sessions to resume.
"""

from __future__ import annotations

import json
import logging
import math
import time
from http import HTTPStatus
from typing import Any

import anyio
from mcp.server.streamable_http import (
    CONTENT_TYPE_JSON,
    LAST_EVENT_ID_HEADER,
    MCP_SESSION_ID_HEADER,
    SSEEvent,
    check_accept_headers,
)
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import DEFAULT_NEGOTIATED_VERSION, INVALID_REQUEST, JSONRPCRequest
from mcp_types.version import is_version_at_least
from sse_starlette import EventSourceResponse
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Send

from ...errors import StorageError, UnknownSessionError
from ...verdicts import Resumption, Verdict
from .._sdk.overrides import ReplicaDispatcher, TransportOverrides
from ..preflight import probe
from ..refusals import bounded, store_trouble, unavailable_error
from ..replicas.forwarding import route
from .error_responses import json_error, not_found, unavailable, unknown, why_gone
from .event_store import SessionView
from .leases import Lease, end_if_lost, give_back, names_another_request, stream_origin, take_lease
from .live import Attachment
from .messages import GET_STREAM, decode_message, is_response_payload, sequence_name
from .sse import Handed, answer_whole, event_data, sse_headers
from .tail import Tail

__all__ = ["PRIMING_SINCE", "ReplayTransport", "header_text"]

logger = logging.getLogger("replaystore.mcp")

#: First protocol revision whose clients understand priming events.
PRIMING_SINCE = "2025-11-25"


class ReplayTransport(TransportOverrides):
    """The SDK transport with fail-closed resumption, store-fed live tails and forwarding.

    Built by the session manager with the session's
    :class:`~replaystore.mcp.sessions.event_store.SessionView` as its event
    store (``kwargs``: the SDK transport's own), which holds the per-session
    state.
    """

    def __init__(self, view: SessionView, **kwargs: Any) -> None:
        super().__init__(event_store=view, **kwargs)
        self._view = view

    @property
    def view(self) -> SessionView:
        """The session's view: its event store, its live streams."""
        return self._view

    # ------------------------------------------------------------ requests
    # (called by the overrides of the SDK's private methods, in overrides.py)

    async def answer_get(self, request: Request, send: Send) -> bool:
        """Plain GETs attach through the store; everything else is the SDK's path."""
        view = self.view
        _, has_sse = check_accept_headers(request)
        if not has_sse or request.headers.get(LAST_EVENT_ID_HEADER):
            # Validation errors, and GET + Last-Event-ID (-> answer_resume below).
            return False
        if not await self._validate_request_headers(request, send):
            return True
        if view.replica is not None and view.replica.draining:
            # The GET stream never ends by itself: open it on a replica that stays.
            await self._unavailable(request, send, draining=True)
            return True
        prime = _primes(request)
        await self._attach(lambda: view.live.attach_get(prime=prime), request, send, prime)
        return True

    async def answer_resume(self, last_event_id: str, request: Request, send: Send) -> bool:
        """Resolve first, answer after: 404 + verdict on failure, never an empty 200."""
        view = self.view
        prime = _primes(request)
        cursor = header_text(last_event_id)
        await self._attach(
            lambda: view.live.attach_resume(cursor, prime=prime), request, send, prime
        )
        return True

    async def answer_post(self, request: Request, send: Send) -> bool:
        """Forward what belongs to another replica; lease the requests that run here."""
        view = self.view
        replica = view.replica
        if replica is None:
            return False
        try:
            body = await request.body()  # cached: the SDK reads it again from this request
        except ClientDisconnect:
            # Nothing was run and nobody is left to answer: one line, not the
            # traceback the server would log for an exception left unhandled.
            logger.info(
                "POST of session %s: the client disconnected before sending its whole body",
                view.session_id,
            )
            return True
        message = _peek(body)
        request_id = _request_id(message)
        initialize = message is not None and message.get("method") == "initialize"
        runs = request_id is not None and message is not None and self._runs(request, body)
        leased = runs and not initialize
        # The SDK stores the request's priming event once its 200 is under
        # way; stored first here, a store refusing it is a 503 as well.
        primes = runs and message is not None and self._sdk_primes(request, message)
        if replica.draining and request_id is not None:
            # New work goes to another replica; answers and notifications for
            # the requests still running here are taken.
            await self._unavailable(request, send, draining=True)
            return True
        if leased and not await self._validate_request_headers(request, send):
            return True
        taken: str | None = None
        try:
            with bounded(replica.settings.store_timeout):
                if initialize:
                    # Open the session in the store before the SDK starts its
                    # 200 response: an outage is a 503 now, not a cut stream.
                    # (Opened already: an initialize sent on a session; the
                    # store must take a write all the same.)
                    if view.opened:
                        await view.buffer.open_session(view.session_id)
                    await view.open()
                    if replica.refused is not None:
                        # The ACL forbade a command a session needs: ask
                        # again, with a whole throwaway session, before
                        # answering 200 for a session that cannot be served.
                        await probe(
                            view.buffer,
                            replica.coordination,
                            replica.registry,
                            replica.id,
                            deep=True,
                        )
                        replica.refused = None
                destination = await self._destination(view, message)
                again = None
                if destination is None and leased and request_id is not None:
                    stream = sequence_name(request_id)
                    lease = await take_lease(view, stream)
                    if lease is Lease.GONE:
                        await self._gone(request, send)
                        return True
                    if lease is Lease.RECEIVED:
                        again = stream
                    else:
                        taken = stream
                if primes and (initialize or taken is not None) and not view.closed:
                    assert request_id is not None
                    await view.prime(request_id)
            if view.closed or self.is_terminated:
                # This replica dropped its copy of the session meanwhile (a
                # store error, an end elsewhere): a retry is served afresh, by
                # whichever replica adopts it again, or answered 404.
                await _let_go(view, taken, request_id)
                await self._unavailable(request, send, dropped=True)
                return True
            if again is not None:
                assert message is not None
                await self._answer_again(view, again, message["id"], request, send)
                return True
            if destination is not None:
                if await self._validate_request_headers(request, send):
                    await replica.forward(destination, view.session_id, body)
                    await self._json(request, send, HTTPStatus.ACCEPTED, None)
                return True
        except (StorageError, UnknownSessionError) as exc:
            await _let_go(view, taken, request_id)
            if isinstance(exc, UnknownSessionError):  # ended while its priming event was stored
                await self._unavailable(request, send, dropped=True)
                return True
            logger.warning(
                "request of session %s answered 503: %s", view.session_id, store_trouble(exc)
            )
            await self._unavailable(request, send, error=exc)
            return True
        return False

    async def answer_delete(self, request: Request, send: Send) -> bool:
        """End the session in the store before the SDK answers DELETE; 503 if the store refuses."""
        view = self.view
        replica = view.replica
        if replica is None or not self.mcp_session_id:
            return False
        if not await self._validate_request_headers(request, send):
            return True
        try:
            with bounded(replica.settings.store_timeout):
                await view.buffer.close_session(view.session_id)
        except StorageError as exc:
            logger.warning(
                "DELETE of session %s answered 503: %s", view.session_id, store_trouble(exc)
            )
            await self._unavailable(request, send, error=exc)
            return True
        return False

    async def deleted(self) -> None:
        """DELETE ends the session in the store and on every replica, not only here."""
        if self.is_terminated:
            await self.view.end_everywhere()

    def close_sse_stream(self, request_id: Any) -> None:
        """Also end the connection when the stream is carried by one of ours (a resumed one)."""
        super().close_sse_stream(request_id)
        self.view.live.close_stream(sequence_name(str(request_id)))

    async def terminate(self) -> None:
        await super().terminate()
        self.view.close_local()

    def close_sdk_stream(self, sequence: str) -> None:
        """Takeover: close the SDK-owned connection of ``sequence`` (the original POST), if any."""
        if sequence == GET_STREAM or not sequence.startswith("#"):
            super().close_sse_stream(sequence)  # the next class in the MRO, not our override

    async def deliver_forwarded(self, body: str) -> None:
        """A client message forwarded by another replica enters this session's loop."""
        from mcp.shared.message import SessionMessage

        writer = self._read_stream_writer
        if writer is None or self.is_terminated:
            return
        try:
            message = decode_message(body.encode("utf-8"))
        except ValueError:
            return
        try:
            await writer.send(SessionMessage(message))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            logger.debug("forwarded message for a session that just ended")

    # ------------------------------------------------------------ internals

    def _runs(self, request: Request, body: bytes) -> bool:
        """True when the SDK will run this POST as a request (not answer it with an error).

        The checks of the SDK's POST handler, before it stores the request's
        priming event and dispatches it (the session's headers are checked
        apart). A request it refuses takes no lease (a lease nobody releases
        would make the corrected request look like one received before) and
        gets no priming event stored (the SDK would never send it).
        """
        has_json, has_sse = check_accept_headers(request)
        if not (has_json if self.is_json_response_enabled else has_json and has_sse):
            return False
        content_type = request.headers.get("content-type", "").split(";")[0]
        if not any(part.strip() == CONTENT_TYPE_JSON for part in content_type.split(",")):
            return False
        try:
            return isinstance(decode_message(body), JSONRPCRequest)
        except ValueError:
            return False

    def _sdk_primes(self, request: Request, message: dict[str, Any]) -> bool:
        """Whether the SDK's POST handler stores (and sends) a priming event for this request.

        Its rule: an SSE response (not JSON-response mode), to a client of
        :data:`PRIMING_SINCE` or later, the version of an ``initialize``
        read from its parameters. Older clients get none, here too.
        """
        if self.is_json_response_enabled:
            return False
        params = message.get("params")
        if message.get("method") == "initialize" and isinstance(params, dict) and params:
            version = str(params.get("protocolVersion", DEFAULT_NEGOTIATED_VERSION))
            return is_version_at_least(version, PRIMING_SINCE)
        return _primes(request)

    async def _answer_again(
        self, view: SessionView, stream: str, request_id: str | int, request: Request, send: Send
    ) -> None:
        """A request received before: attach the client to its stream, do not run it again.

        The client gets the request's stream from its start (replay, then
        live): the one response, or the "request lost" error if the replica
        that ran it stopped, exactly like a client resuming that stream.

        Unless the stream answers another request (``"0"`` after ``0``, see
        :func:`names_another_request`): that one is not run (its answer would
        land in the earlier one's stream) and gets a 400, never that answer.
        """
        _, has_sse = check_accept_headers(request)
        if not has_sse:
            await self._json_error(
                request,
                send,
                HTTPStatus.NOT_ACCEPTABLE,
                INVALID_REQUEST,
                "Not Acceptable: this request was received before; its answer is sent "
                "again as a text/event-stream",
                None,
            )
            return
        logger.info(
            "request %r of session %s was received before; attaching to its stream "
            "instead of running it again",
            stream[:64],
            view.session_id,
        )
        try:
            origin = await stream_origin(view, stream)
            other = origin is not None and await names_another_request(
                view, origin, stream, request_id
            )
        except StorageError as exc:
            await self._unavailable(request, send, error=exc)
            return
        except UnknownSessionError:
            await self._gone(request, send)
            return
        if origin is None:
            await self._json_error(
                request,
                send,
                HTTPStatus.CONFLICT,
                INVALID_REQUEST,
                "Conflict: this request was received before and its stream can no longer "
                "be replayed from its start (its events were evicted); it was not run again",
                {"reason": "request_received"},
            )
            return
        if other:
            await self._json_error(
                request,
                send,
                HTTPStatus.BAD_REQUEST,
                INVALID_REQUEST,
                "Bad Request: this request id names the same stream as an earlier request of "
                'this session (as "0" and 0 do); it was not run: send it with another id',
                {"reason": "request_id_taken"},
            )
            return
        prime = _primes(request)
        await self._attach(
            lambda: view.live.attach_again(origin, stream, prime=prime), request, send, prime
        )

    async def _gone(self, request: Request, send: Send) -> None:
        """The store no longer has this session: forget it here, answer 404 (initialize again)."""
        view = self.view
        logger.info("session %s is no longer in the store; answered 404", self.mcp_session_id)
        view.close_local()
        await view.discard()
        session_id = self.mcp_session_id or ""
        gone = await self._why_gone(session_id)
        await not_found(session_id, gone)(request.scope, request.receive, send)

    async def _why_gone(self, session_id: str) -> Resumption:
        """Why a session served here is gone from the store, as far as the store still says."""
        view = self.view
        replica = view.replica
        if replica is None:
            return unknown(session_id, served=True)
        return await why_gone(view.buffer, session_id, replica.settings.store_timeout, served=True)

    async def _destination(self, view: SessionView, message: dict[str, Any] | None) -> str | None:
        """The other replica a client message must go to, or None to handle it here."""
        replica = view.replica
        if replica is None or message is None:
            return None
        where = route(message)
        if where is None:
            return None
        target = where.replica
        if where.cancels is not None:
            target = await replica.registry.owner(view.session_id, sequence_name(where.cancels))
        return target if target is not None and target != replica.id else None

    async def _attach(
        self,
        attach: Any,
        request: Request,
        send: Send,
        prime: bool,
    ) -> None:
        view = self.view
        replica = view.replica
        # A resume waits for the store no longer than a POST does: a store
        # that hangs is a 503 after store_timeout (not the Redis client's
        # socket timeout, once per command), which a balancer can pass on.
        timeout = replica.settings.store_timeout if replica is not None else math.inf
        try:
            with bounded(timeout):
                attachment: Attachment = await attach()
        except StorageError as exc:
            await self._unavailable(request, send, resumption=True, error=exc)
            return
        except UnknownSessionError:
            assert self.mcp_session_id is not None
            attachment = Attachment(unknown(self.mcp_session_id, served=True))
        if not attachment.ok:
            await self.fail_closed(attachment.resumption, request, send)
            return
        if attachment.stream == GET_STREAM and replica is not None and replica.draining:
            # Request streams end with their response and are served while
            # draining; the GET stream would hold the shutdown to its end.
            if attachment.tail is not None:
                await view.live.detach(attachment.tail)
            await self._unavailable(request, send, draining=True)
            return
        await self._stream(attachment, request, send, prime)

    async def _unavailable(
        self,
        request: Request,
        send: Send,
        *,
        resumption: bool = False,
        draining: bool = False,
        dropped: bool = False,
        error: StorageError | None = None,
    ) -> None:
        data: dict[str, Any]
        if error is not None and error.permanent:
            replica = self.view.replica
            if replica is not None:
                replica.refused = error
        if draining:
            message = "Service Unavailable: this server replica is shutting down; retry"
            reason = "draining"
        elif dropped:
            message = "Service Unavailable: this server replica just let the session go; retry"
            reason = "session_dropped"
        else:
            message, data = unavailable_error(error, resumption=resumption)
        if draining or dropped:
            data = {"verdict": None, "reason": reason}
        response = unavailable(self.mcp_session_id, message, data)
        await response(request.scope, request.receive, send)

    async def fail_closed(self, resumption: Resumption, request: Request, send: Send) -> None:
        """End the session everywhere, then answer 404 with the verdict and its evidence."""
        view = self.view
        if resumption.verdict is Verdict.UNKNOWN_SESSION and resumption.evidence.tombstone is None:
            # Gone under this live session: why, if the store still says.
            resumption = await self._why_gone(resumption.evidence.session)
        await view.end_everywhere(failed=True)
        loop = view.connection.outbound if view.connection is not None else None
        if isinstance(loop, ReplicaDispatcher):
            loop.end_quietly()  # before its streams close (discard closes them)
        await view.discard()
        if not self.is_terminated:
            with anyio.CancelScope(shield=True):
                await self.terminate()
        response = not_found(self.mcp_session_id, resumption)
        await response(request.scope, request.receive, send)

    async def _json(self, request: Request, send: Send, status: HTTPStatus, body: Any) -> None:
        headers = {"Content-Type": CONTENT_TYPE_JSON}
        if self.mcp_session_id:
            headers[MCP_SESSION_ID_HEADER] = self.mcp_session_id
        content = None if body is None else json.dumps(body, default=str)
        response = Response(content, status_code=int(status), headers=headers)
        await response(request.scope, request.receive, send)

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
        response = json_error(self.mcp_session_id, status, code, message, data, extra_headers)
        await response(request.scope, request.receive, send)

    def _priming(self, event_id: str) -> SSEEvent:
        data: SSEEvent = {"id": event_id, "data": ""}
        if self._retry_interval is not None:
            data["retry"] = self._retry_interval
        return data

    async def _stream(
        self, attachment: Attachment, request: Request, send: Send, prime: bool
    ) -> None:
        """Send the replay, then the live tail, as one SSE response.

        A replay with nothing after it (it holds the stream's response) is
        written as stored, in one piece; a stream that goes on live is a
        streaming response (pings, a closed connection noticed).
        """
        view = self.view
        tail = attachment.tail
        stream = attachment.stream
        if tail is None:
            await answer_whole(send, self.mcp_session_id, attachment.replay)
            return
        headers = sse_headers(self.mcp_session_id)
        writer, reader = anyio.create_memory_object_stream[SSEEvent](0)
        # Cancelled by a takeover, close_sse_stream or the session's end.
        ends_with_response = stream != GET_STREAM

        async def sender() -> None:
            try:
                async with writer:
                    with tail.delivering():
                        for event in attachment.replay:
                            await writer.send(event_data(event))
                            view.live.delivered(tail, event.event_id)
                        if attachment.first is not None:
                            await self._prime(view, tail, writer, prime, attachment.first)
                        await self._follow(view, tail, writer, prime, ends_with_response)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                logger.debug("resumed SSE stream %r closed", stream)
            except Exception:
                logger.exception("error in the SSE writer of stream %r", stream)
            finally:
                await view.live.detach(tail)

        # Each event is marked delivered by whichever side completes its hand-over:
        # the writer once its send returns, the response as it takes the event
        # (a writer cancelled in the middle of a send may have handed it).
        content = Handed(reader, lambda event_id: view.live.delivered(tail, event_id))
        response = EventSourceResponse(
            content=content, data_sender_callable=sender, headers=headers
        )
        try:
            await response(request.scope, request.receive, send)
        except Exception:  # pragma: no cover - mirrors the SDK's guard
            logger.exception("error in the SSE response of stream %r", stream)
        finally:
            await writer.aclose()
            await reader.aclose()
            await view.live.detach(tail)

    async def _prime(
        self, view: SessionView, tail: Tail, writer: Any, prime: bool, event_id: str
    ) -> None:
        """A priming event: written to clients that understand it, marked delivered either way.

        One never written is marked only while the tail is open: a connection
        closed by a takeover has no say in where the stream goes on.
        """
        if prime:
            await writer.send(self._priming(event_id))
        elif tail.closed:
            return
        view.live.delivered(tail, event_id)

    async def _follow(
        self,
        view: SessionView,
        tail: Tail,
        writer: Any,
        prime: bool,
        ends_with_response: bool,
    ) -> None:
        """Live delivery: after each wake-up (or check interval), read the rest from the store."""
        last_check = time.monotonic()
        interval = view.live.check_interval(tail.sequence)
        while not tail.closed:
            await tail.wait(interval)
            if tail.closed:
                return
            try:
                caught = await view.live.catch_up(tail)
            except StorageError as exc:
                logger.warning(
                    "live stream %r of session %s ended: %s; "
                    "the client resumes from its last event id",
                    tail.sequence[:64],
                    view.session_id,
                    store_trouble(exc),
                )
                return
            if not caught.ok:
                # Events this connection never delivered are gone: a failed
                # verdict (the store tore the session down), never a silent gap.
                logger.warning(
                    "live stream %r of session %s cannot continue: %s; session ended",
                    tail.sequence[:64],
                    view.session_id,
                    caught.verdict.value,
                )
                await view.end_everywhere(failed=True)
                await view.discard()
                return
            for event in caught.events:
                tail.advance(event.event_id)
                if event.payload is None:
                    await self._prime(view, tail, writer, prime, event.event_id)
                    continue
                await writer.send(event_data(event))
                view.live.delivered(tail, event.event_id)
                if ends_with_response and is_response_payload(event.payload):
                    return
            now = time.monotonic()
            if ends_with_response and not caught.events and now - last_check >= interval:
                last_check = now
                await end_if_lost(view, tail)


async def _let_go(view: SessionView, taken: str | None, request_id: str | None) -> None:
    """A request leased (or primed) here is not run after all: its retry must run it.

    Its lease is given back (shielded: it runs as the request is answered
    503; a store refusing it too leaves the lease to lapse). A priming event
    stored already stays stored: only a close of the session in this process
    during that very write leaves one (or a write whose answer came too late),
    and the retry, finding the request's stream started and nobody holding
    its lease, answers it as lost: never run twice, never a cut response.
    """
    if request_id is not None:
        view.primed.pop(request_id, None)
    if taken is not None:
        await give_back(view, taken)


def _primes(request: Request) -> bool:
    version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
    return is_version_at_least(version, PRIMING_SINCE)


def header_text(value: str) -> str:
    """A header as the client wrote it: UTF-8 where it is (the server decoded it as Latin-1).

    Event ids issued here are ASCII; a client that sends anything else gets
    its own text back in the verdict's evidence, not mojibake.
    """
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def _peek(body: bytes) -> dict[str, Any] | None:
    """The POSTed message as plain JSON, if it is one object (the SDK validates it properly)."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _request_id(message: dict[str, Any] | None) -> str | None:
    """The stream id of a POSTed request (its JSON-RPC id as the SDK names it), or None."""
    if message is None or not isinstance(message.get("method"), str):
        return None
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    return str(request_id)

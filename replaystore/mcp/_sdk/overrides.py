"""Every override of a private method of the MCP SDK, in one module.

The SDK offers no public way to keep sessions in a shared store, so
:mod:`replaystore.mcp` replaces a few private methods of its transport, its
session manager and its JSON-RPC dispatcher. They are all here, each a thin
hook that says which SDK method it replaces (or extends) and why, then hands
over to this package's code (:class:`~replaystore.mcp.sessions.transport.ReplayTransport`,
:class:`~replaystore.mcp.sessions.manager.ReplaySessionManager`) or back to the SDK's.
Nothing else in the package overrides a private SDK method (a test checks it).

:mod:`replaystore.mcp._sdk.checked` lists each overridden method with a digest of its
upstream source; a test fails when an SDK upgrade changes that source, so the
override here is read again against the new code instead of drifting from it.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any
from uuid import uuid4

import anyio
import anyio.abc
from mcp.server import streamable_http_manager as sdk_manager
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from ..replicas.forwarding import server_request_id

__all__ = ["UNSERVED", "ManagerOverrides", "ReplicaDispatcher", "TransportOverrides"]

logger = logging.getLogger("replaystore.mcp")


class TransportOverrides(StreamableHTTPServerTransport):
    """The private methods of the SDK's transport that :class:`ReplayTransport` replaces.

    Each hook (``answer_*``) returns True when this package answered the
    request, False to let the SDK's own method answer it.
    """

    async def _handle_get_request(self, request: Request, send: Send) -> None:
        """Replaces ``StreamableHTTPServerTransport._handle_get_request``.

        Plain GETs attach through the store (messages stored while no GET was
        attached are delivered; a second GET takes the stream over instead of
        a 409); validation errors and GET + ``Last-Event-ID`` stay the SDK's.
        """
        if not await self.answer_get(request, send):
            await super()._handle_get_request(request, send)

    async def _replay_events(self, last_event_id: str, request: Request, send: Send) -> None:
        """Replaces ``StreamableHTTPServerTransport._replay_events``.

        The SDK starts the 200 SSE response before asking the store; here the
        atomic resolve runs first: 404 with the verdict on failure, never an
        empty 200.
        """
        if not await self.answer_resume(last_event_id, request, send):
            await super()._replay_events(last_event_id, request, send)

    async def _handle_post_request(
        self, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        """Replaces ``StreamableHTTPServerTransport._handle_post_request``.

        A client message that belongs to a request running on another replica
        is forwarded there; a request that runs here takes its lease first;
        the SDK then handles the POST as usual.
        """
        if not await self.answer_post(request, send):
            await super()._handle_post_request(scope, request, receive, send)

    async def _handle_delete_request(self, request: Request, send: Send) -> None:
        """Extends ``StreamableHTTPServerTransport._handle_delete_request``.

        The session ends in the store first (a store that refuses is a 503
        the client retries, not a 200 for a session that lives on), then the
        SDK's DELETE, then the session ends on every replica, not only here.
        """
        if await self.answer_delete(request, send):
            return
        await super()._handle_delete_request(request, send)
        await self.deleted()

    # -- what ReplayTransport provides

    async def answer_get(self, request: Request, send: Send) -> bool:
        raise NotImplementedError

    async def answer_resume(self, last_event_id: str, request: Request, send: Send) -> bool:
        raise NotImplementedError

    async def answer_post(self, request: Request, send: Send) -> bool:
        raise NotImplementedError

    async def answer_delete(self, request: Request, send: Send) -> bool:
        raise NotImplementedError

    async def deleted(self) -> None:
        raise NotImplementedError


#: Set in a request's scope once ``answer_unserved`` has looked at it and left
#: it to the SDK (the resume lane calls it before the app's routing): the
#: manager's usual entry then does not call it again.
UNSERVED = "replaystore.unserved"


class ManagerOverrides(StreamableHTTPSessionManager):
    """The private methods of the SDK's session manager that the package's manager replaces."""

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Replaces ``StreamableHTTPSessionManager._handle_stateful_request``.

        A session this process does not serve but the store knows is adopted
        first (or the request answered 503 when the store cannot say); then
        the SDK serves the request, or answers 404 for a session nobody knows.
        """
        if scope.get(UNSERVED) or not await self.answer_unserved(scope, receive, send):
            await super()._handle_stateful_request(scope, receive, send)

    def _admit_session(
        self, requestor: AuthorizationContext | None, session_id: str | None = None
    ) -> StreamableHTTPServerTransport | None:
        """Replaces ``StreamableHTTPSessionManager._admit_session``.

        The SDK's steps (the session limit, the session table, the credential
        that created the session), with this package's transport
        (:meth:`new_transport`), which the SDK's builds inline. ``session_id``:
        a session created elsewhere, adopted here (a new id when omitted).
        """
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        if session_id is None:
            session_id = uuid4().hex
            logger.info("Created new transport with session ID: %s", session_id)
        transport = self.new_transport(session_id, requestor)
        if requestor is not None:
            self._session_owners[session_id] = requestor
        self._server_instances[session_id] = transport
        return transport

    async def _serve_opening_request(
        self,
        http_transport: StreamableHTTPServerTransport,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Replaces ``StreamableHTTPSessionManager._serve_opening_request``.

        The SDK's own steps, with this package's session loop
        (:meth:`run_session`): the SDK's loop is a closure calling
        ``serve_loop``, which builds its own dispatcher, and the session needs
        one whose request ids name this replica. The status check is the
        SDK's own ``_send_and_report_status``.
        """
        session_id = http_transport.mcp_session_id
        assert session_id is not None
        established = False
        try:
            assert self._task_group is not None
            await self._task_group.start(partial(self.run_session, http_transport, None))
            status = await sdk_manager._send_and_report_status(
                http_transport.handle_request, scope, receive, send
            )
            established = status is not None and status < 400
        finally:
            if not established:
                await self._discard_session(session_id, http_transport)

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        """Extends ``StreamableHTTPSessionManager._discard_session``.

        The session is forgotten in this process only: it lives on in the
        store and on the other replicas.
        """
        await super()._discard_session(session_id, transport)
        self.discarded(session_id, transport)

    # -- what ReplaySessionManager provides

    async def answer_unserved(self, scope: Scope, receive: Receive, send: Send) -> bool:
        raise NotImplementedError

    def new_transport(
        self, session_id: str, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport:
        raise NotImplementedError

    async def run_session(
        self,
        transport: StreamableHTTPServerTransport,
        record: dict[str, str] | None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        raise NotImplementedError

    def discarded(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        raise NotImplementedError


class ReplicaDispatcher(JSONRPCDispatcher[Any]):
    """The SDK's dispatcher, numbering its requests to the client ``"<n>@<replica>"``.

    Every replica serving a session has its own dispatcher with its own
    counter; bare numbers would collide between replicas, and an answer could
    not tell which replica waits for it (see :mod:`replaystore.mcp.replicas.forwarding`).
    """

    replica: str = ""

    def _allocate_id(self) -> str:  # type: ignore[override]
        """Replaces ``JSONRPCDispatcher._allocate_id``: the id names this replica."""
        self._next_id += 1
        return server_request_id(self._next_id, self.replica)

    def end_quietly(self) -> None:
        """Cancel the loop's handlers from a callback of the event loop: call before its
        streams are closed.

        The SDK's ``run`` cancels its task group on the way out in any case
        (its handlers' callers are gone), and anyio writes the task that
        cancels a scope into the scope's reason: the session task's repr (its
        coroutine, its callbacks), formatted for nobody. A callback runs in no
        task, and, scheduled before the streams close, ahead of the loop's
        wake-up to their end; the SDK's own cancel then finds the scope
        cancelled already. Its handlers are cancelled as the SDK cancels them.
        """
        group = self._tg
        if group is not None:
            asyncio.get_running_loop().call_soon(group.cancel_scope.cancel)

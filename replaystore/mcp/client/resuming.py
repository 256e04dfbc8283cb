"""Client side of a session the server ended: why, as an exception, then a new session.

A replaystore MCP server answers a resumption it cannot prove exact, and
any request for a session it ended or does not know, with HTTP 404 and the
verdict in the JSON-RPC error's ``data``::

    {"jsonrpc": "2.0", "id": null, "error": {"code": -32600,
     "message": "Not Found: cannot resume (...)",
     "data": {"verdict": "below_floor", "evidence": {...}}}}

(``unknown_session`` for a session that is gone, with the tombstone saying
how it ended). The protocol says a client that gets 404 for its session
starts a new one. The SDK's client (and FastMCP's, which is built on it)
does not: it retries a resumption's GET, then fails the call with
"reconnection attempts exhausted", and every later call with "Session not
found" or "Session terminated"; it never shows the verdict. This module
gives a client the verdict and a way back:

- :func:`desync_error` turns such a body into :class:`~replaystore.ResumptionDesyncError`;
- :class:`DesyncWatch` is the one way a client gets it: a response event hook
  that records, per session, the first 404 and its verdict, on any
  ``httpx``/``httpx2`` client (one driven by hand, or the SDK's and FastMCP's,
  which handle the 404 themselves), and builds hooked ``httpx2`` clients for
  the SDK and for FastMCP (``httpx_client_factory``);
- :class:`ResumingSession` runs an SDK ``ClientSession`` and opens a new one
  on any 404 for it: a call the server refused with 404 (it never ran) is
  sent again on the new session, one that may have run raises the verdict.

Tools run as durable tasks (2026-07-28) have their own client,
:class:`~replaystore.mcp.client.TaskClient`, exported beside this one by
:mod:`replaystore.mcp.client`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Protocol, TypeVar

import anyio
import anyio.abc

from ...verdicts import (
    Evidence,
    Resumption,
    ResumptionDesyncError,
    Tombstone,
    Verdict,
    reason_text,
)
from .unavailable import DEFAULT_BUDGET, RetryBudget, RetryUnavailable

__all__ = [
    "DesyncWatch",
    "OnNewSession",
    "ResumingSession",
    "desync_error",
    "session_gone",
]

T = TypeVar("T")

#: A 404 body larger than this is not one of ours; it is left unread.
_MAX_BODY = 1 << 20

_EVIDENCE_FIELDS = frozenset(Evidence.__dataclass_fields__)


class _Response(Protocol):
    """What the hooks need from an ``httpx.Response`` or ``httpx2.Response``."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def aread(self) -> bytes: ...


def desync_error(body: bytes | str | Mapping[str, Any]) -> ResumptionDesyncError | None:
    """The :class:`ResumptionDesyncError` a 404 body carries, or ``None`` if it carries none.

    ``None`` for anything that is not a JSON-RPC error whose ``data`` names a
    failed verdict this library knows (a 404 for an unknown session without a
    verdict, an HTML error page, ``resumed``).
    """
    if not isinstance(body, Mapping):
        try:
            body = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
    if not isinstance(body, Mapping):
        return None
    error = body.get("error")
    data = error.get("data") if isinstance(error, Mapping) else None
    if not isinstance(data, Mapping):
        return None
    try:
        verdict = Verdict(str(data.get("verdict")))
    except ValueError:
        return None
    if verdict.ok:
        return None
    raw = data.get("evidence")
    message = error.get("message") if isinstance(error, Mapping) else None
    evidence = _evidence(raw if isinstance(raw, Mapping) else {}, message)
    return ResumptionDesyncError(Resumption(verdict, evidence, sequence=evidence.sequence))


def _evidence(raw: Mapping[str, Any], message: object) -> Evidence:
    """Rebuild :class:`Evidence` from its ``as_dict`` form, keeping only the fields it has."""
    fields: dict[str, Any] = {k: v for k, v in raw.items() if k in _EVIDENCE_FIELDS}
    fields["session"] = str(fields.get("session", ""))
    fields["reason"] = str(fields.get("reason", message or "resumption failed"))
    fields["torn_down"] = bool(fields.get("torn_down", False))
    tomb = fields.get("tombstone")
    if isinstance(tomb, Mapping):
        try:
            tomb_verdict = Verdict(tomb["verdict"]) if tomb.get("verdict") else None
            fields["tombstone"] = Tombstone(str(tomb["reason"]), float(tomb["at"]), tomb_verdict)
        except (KeyError, TypeError, ValueError):
            fields["tombstone"] = None
    else:
        fields["tombstone"] = None
    return Evidence(**fields)


async def _read_desync(response: _Response) -> ResumptionDesyncError | None:
    if response.status_code != 404:
        return None
    if not response.headers.get("content-type", "").lower().startswith("application/json"):
        return None
    length = response.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > _MAX_BODY):
        return None
    # aread() caches the body, so the client can still read it after the hook.
    return desync_error(await response.aread())


def session_gone(session: str) -> ResumptionDesyncError:
    """The error for a 404 that names no verdict (another server, a proxy): ``unknown_session``."""
    gone = Resumption(Verdict.UNKNOWN_SESSION, Evidence(session, reason_text("no_session")))
    return ResumptionDesyncError(gone)


class DesyncWatch:
    """Remembers the sessions its hook saw answered 404, for clients that swallow the exception.

    The SDK's client turns a 404 into an error it handles itself (it retries
    a resumption, then says "reconnection attempts exhausted"; a POST gets
    "Session not found"), so the verdict never reaches the caller, and the
    client goes on using the dead session. This hook does not raise (raising
    inside the SDK's tasks would tear its transport down); it records, per
    session id, the first 404 (its verdict when the body carries one, else
    ``unknown_session``), and :meth:`pop` hands the first one over once.
    It also counts the requests the server refused with 404 (they never
    ran) and the ones it took, so :class:`ResumingSession` knows whether a
    failed call is safe to send again. ``client_factory`` has the signature
    the SDK's and FastMCP's ``httpx_client_factory`` expect; its clients
    send a request answered 503 with ``Retry-After`` again within ``retry``
    (``None``: never; the 503 then fails the call, as in the SDK).
    """

    def __init__(self, *, retry: RetryBudget | None = DEFAULT_BUDGET) -> None:
        self.retry = retry
        self._seen: ResumptionDesyncError | None = None
        self._ended: dict[str, ResumptionDesyncError] = {}
        #: The session id the server gave in answer to the last ``initialize``.
        self.session_id: str | None = None
        #: Requests (not ``initialize``) the server answered with 404, and with anything else.
        self.refused = 0
        self.taken = 0

    async def hook(self, response: _Response) -> None:
        """Response event hook: record a 404 for a session, and count request outcomes."""
        request = getattr(response, "request", None)
        headers: Mapping[str, str] = getattr(request, "headers", None) or {}
        asked = headers.get(_SESSION_HEADER)
        if asked is None:
            given = response.headers.get(_SESSION_HEADER)
            if given is not None and response.status_code < 300:
                self.session_id = given  # the answer to an initialize
        elif _posted_request(request):
            if response.status_code == 404:
                self.refused += 1
            else:
                self.taken += 1
        if response.status_code != 404 or asked is None:
            return
        error = await _read_desync(response)
        if error is None:
            error = session_gone(asked)
        if asked not in self._ended:  # the first 404 is the cause; later ones follow from it
            self._ended[asked] = error
            if len(self._ended) > _ENDED:
                del self._ended[next(iter(self._ended))]
        if self._seen is None:
            self._seen = error

    def ended(self, session: str | None) -> ResumptionDesyncError | None:
        """Why ``session`` ended, if the server answered 404 for it."""
        return None if session is None else self._ended.get(session)

    def pop(self) -> ResumptionDesyncError | None:
        """The first 404 for a session seen since the last call, if any."""
        error, self._seen = self._seen, None
        return error

    def client_factory(
        self,
        headers: dict[str, str] | None = None,
        timeout: Any = None,
        auth: Any = None,
        **options: Any,
    ) -> Any:
        """An ``httpx2.AsyncClient`` with this watch's hook, for the SDK or FastMCP.

        Without ``timeout``, the SDK client's own defaults: 30 s, and 300 s to
        read (a response stream may stay open). Without ``transport``, a
        :class:`~replaystore.mcp.client.OncePerStream`: no event reaches the
        application twice, even when the client resumes from a stale id.
        Unless the watch's ``retry`` is ``None``, the transport is wrapped
        in a :class:`~replaystore.mcp.client.RetryUnavailable` with that
        budget: a request answered 503 with ``Retry-After`` is sent again
        (a replaystore server never runs a request twice for it).
        Other options go to the client.
        """
        import httpx2

        from .once import OncePerStream

        transport = options.pop("transport", None) or OncePerStream()
        if self.retry is not None:
            transport = RetryUnavailable(transport, self.retry)
        options["transport"] = transport
        if timeout is None:
            timeout = httpx2.Timeout(30.0, read=300.0)
        client = httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, **options)
        client.event_hooks["response"].append(self.hook)
        return client


_SESSION_HEADER = "mcp-session-id"

#: Ended sessions a watch remembers (a client replaces each as it ends: a few at most).
_ENDED = 64


def _posted_request(request: Any) -> bool:
    """Whether ``request`` POSTs a JSON-RPC request (not ``initialize``, not a notification)."""
    if getattr(request, "method", None) != "POST":
        return False
    try:
        body = request.content
    except Exception:  # a streamed body, not read: not one the SDK sends
        return False
    if not isinstance(body, bytes) or len(body) > _MAX_BODY or b'"method"' not in body:
        return False
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(message, dict)
        and "id" in message
        and isinstance(message.get("method"), str)
        and message["method"] != "initialize"
    )


def _leaf(exc: Exception) -> Exception:
    """The one error inside the exception groups of the SDK's task groups, else ``exc``."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


#: What :class:`ResumingSession` calls once per new session that replaces an ended one.
OnNewSession = Callable[[Any, ResumptionDesyncError | None], Awaitable[None] | None]


class _Opening:
    """One session being opened by the host task: what its waiters get when it is done."""

    __slots__ = ("done", "error", "session", "session_id")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.session: Any = None
        self.session_id: str | None = None
        self.error: BaseException | None = None


class ResumingSession:
    """An MCP client session that starts a new one whenever the server ends it.

    ::

        async def restore(session, ended):
            log.warning("new session: %s %s", ended.verdict, ended.resumption.evidence.reason)
            await session.subscribe_resource("file:///status")

        async with ResumingSession(url, on_new_session=restore) as mcp:
            try:
                result = await mcp.call_tool("countdown", {"n": 100})
            except ResumptionDesyncError as exc:
                # the call may have run: its result was lost; mcp.session is a fresh session
                log.warning("lost: %s %s", exc.verdict, exc.resumption.evidence.as_dict())

    Any 404 for the session's id (a failed resumption, a session the server
    ended or no longer has) ends it, as the protocol says: the next call
    runs on a new, initialized session, and ``on_new_session(session,
    ended)`` is awaited once for each new one (not for the first) before any
    call uses it, with the :class:`ResumptionDesyncError` saying why the
    previous one ended (``None`` after :meth:`reinitialize`). A call the
    server refused with 404 never ran: it is sent once more, on the new
    session. A call that may have run (its request was taken, then its
    stream could not be resumed) is not: it raises
    :class:`ResumptionDesyncError`, chained to the client's own error,
    after the new session is open.

    Sessions are opened and closed by a task of the ``ResumingSession``
    (started where it is entered), never inside a caller's cancel scope: a
    call under ``anyio.fail_after`` that starts a new session leaves it
    running when its deadline passes. It is entered and left by one task
    (it holds a task group); calls may come from any task.

    A request the server answered 503 with ``Retry-After`` (its store did
    not answer in time; the replica is shutting down) is sent again after
    the wait it asks, within ``retry`` (a
    :class:`~replaystore.mcp.client.RetryBudget`; ``None``: never, the call
    fails with the SDK's error as without this class): a replaystore server
    never runs a request twice for it (see
    :mod:`replaystore.mcp.client.unavailable`). Other keyword arguments go
    to the SDK's ``ClientSession`` (callbacks, timeouts).
    """

    def __init__(
        self,
        url: str,
        *,
        on_new_session: OnNewSession | None = None,
        retry: RetryBudget | None = DEFAULT_BUDGET,
        **session_options: Any,
    ) -> None:
        self.url = url
        self.watch = DesyncWatch(retry=retry)
        self.on_new_session = on_new_session
        self._options = session_options
        self._stack: AsyncExitStack | None = None
        self._group: anyio.abc.TaskGroup | None = None
        self._opening = _Opening()
        self._wanted = anyio.Event()
        self._cause: ResumptionDesyncError | None = None
        self._closing = False

    @property
    def session(self) -> Any:
        """The current, initialized ``mcp.ClientSession``."""
        session = self._opening.session if self._opening.done.is_set() else None
        if session is None or self._stack is None:
            raise RuntimeError("ResumingSession is not open")
        return session

    @property
    def session_id(self) -> str | None:
        """The ``Mcp-Session-Id`` of the current session."""
        return self._opening.session_id

    async def __aenter__(self) -> ResumingSession:
        stack = AsyncExitStack()
        group = await stack.enter_async_context(anyio.create_task_group())
        try:
            await group.start(self._host)
        except BaseException:
            await stack.__aexit__(None, None, None)
            raise
        self._stack, self._group = stack, group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        self._closing = True
        if self._group is not None and not self._opening.done.is_set():
            self._group.cancel_scope.cancel()  # a session still opening is not waited for
        self._wanted.set()
        if stack is not None:
            await stack.aclose()

    async def _connect(self, stack: AsyncExitStack) -> Any:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        http = await stack.enter_async_context(self.watch.client_factory())
        read, write = await stack.enter_async_context(
            streamable_http_client(self.url, http_client=http)
        )
        session = await stack.enter_async_context(ClientSession(read, write, **self._options))
        await session.initialize()
        return session

    async def _host(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Open a session, hold it until it must be replaced, close it; again, until closed.

        Runs in the task group entered with this object, so every session's
        own tasks live outside whatever cancel scope a caller is in.
        """
        started = False
        while not self._closing:
            opening, cause, wanted = self._opening, self._cause, self._wanted
            self.watch.pop()  # what the ended session's last requests were told
            try:
                failed: Exception | None = None
                async with AsyncExitStack() as stack:
                    session = await self._connect(stack)
                    opening.session, opening.session_id = session, self.watch.session_id
                    if started:
                        failed = await self._restore(session, cause)
                    if failed is None:
                        opening.done.set()
                        if not started:
                            started = True
                            task_status.started()
                        await wanted.wait()
                if failed is not None:  # raised here, once the session is closed
                    raise failed
            except Exception as exc:
                error = _leaf(exc)
                if not started:
                    raise error from None  # the first session: entering this object fails
                if not opening.done.is_set():
                    opening.session, opening.error = None, error
                    opening.done.set()
                await wanted.wait()  # a caller asks again (or the session closes)

    async def _restore(self, session: Any, cause: ResumptionDesyncError | None) -> Exception | None:
        """``on_new_session``'s error, if it raised (a session it could not restore is not used)."""
        if self.on_new_session is None:
            return None
        try:
            restored = self.on_new_session(session, cause)
            if inspect.isawaitable(restored):
                await restored
        except Exception as exc:
            return exc
        return None

    def _ask(self, ended: _Opening, cause: ResumptionDesyncError | None) -> None:
        """Have the host replace ``ended``, unless another caller did already."""
        if self._opening is ended:
            self._opening, self._cause = _Opening(), cause
            wanted, self._wanted = self._wanted, anyio.Event()
            wanted.set()

    async def _renew(self, ended: _Opening, cause: ResumptionDesyncError | None) -> _Opening:
        """The session that replaces ``ended``: asked for once, however many callers saw it end."""
        self._ask(ended, cause)
        return await self._ready(again=False)

    async def _ready(self, *, again: bool = True) -> _Opening:
        """The current session's opening once it is open (its error if that failed).

        ``again``: an opening that failed before (the server was down, or
        ``on_new_session`` raised) is tried once more for this caller.
        """
        opening = self._opening
        if again and opening.done.is_set() and opening.error is not None:
            self._ask(opening, self._cause)
            opening = self._opening
        await opening.done.wait()  # a caller's deadline ends this wait, not the opening
        if opening.error is not None:
            raise opening.error
        if self._stack is None:
            raise RuntimeError("ResumingSession is not open")
        return opening

    async def reinitialize(self) -> None:
        """Drop the current session and open a new one (``on_new_session`` is told ``None``)."""
        await self._renew(self._opening, None)

    async def run(self, call: Callable[[Any], Awaitable[T]]) -> T:
        """``await call(session)`` on a live session; a call refused with 404 once more.

        Before the call, a session the server answered 404 for (on any of its
        requests or streams, since the last call) is replaced. When the call
        fails and the server answered 404 for its session meanwhile, a new
        session is opened; the call is then sent again if the server refused
        it without running it (every request of the call was answered 404),
        else :class:`ResumptionDesyncError` is raised with the server's
        verdict and evidence, chained to the client's own error. Other
        failures propagate and keep the session.
        """
        opening = await self._ready()
        ended = self.watch.ended(opening.session_id)
        if ended is not None:
            opening = await self._renew(opening, ended)
        refused, taken = self.watch.refused, self.watch.taken
        try:
            return await call(opening.session)
        except Exception as exc:
            ended = self.watch.ended(opening.session_id)
            if ended is None:
                raise
            never_ran = self.watch.refused > refused and self.watch.taken == taken
            opening = await self._renew(opening, ended)
            if not never_ran:
                raise ended from exc
        return await call(opening.session)

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None, **kw: Any) -> Any:
        """``session.call_tool`` through :meth:`run`."""
        return await self.run(lambda session: session.call_tool(name, arguments, **kw))

"""Client side of a failed resumption: the server's verdict as an exception, then a new session.

A replaystore MCP server answers a resumption it cannot prove exact with HTTP
404 and the verdict in the JSON-RPC error's ``data``::

    {"jsonrpc": "2.0", "id": null, "error": {"code": -32600,
     "message": "Not Found: cannot resume (...)",
     "data": {"verdict": "below_floor", "evidence": {...}}}}

The SDK's client (and FastMCP's, which is built on it) retries that GET, then
fails the call with "reconnection attempts exhausted" and every later call
with "Session terminated"; it never shows the verdict and never opens a new
session. This module gives a client the verdict and a way back:

- :func:`desync_error` turns such a body into :class:`~replaystore.ResumptionDesyncError`;
- :func:`raise_for_desync` is an ``httpx``/``httpx2`` response event hook that raises it;
- :class:`DesyncWatch` records what its hook saw, for clients that handle the
  404 themselves (the SDK's does), and builds hooked ``httpx2`` clients for
  the SDK and for FastMCP (``httpx_client_factory``);
- :class:`ResumingSession` runs an SDK ``ClientSession`` and, when a call fails
  after a failed resumption, opens a fresh session and raises the verdict.
  The failed call is not retried: it may already have had effects.

Tools run as durable tasks (2026-07-28) have their own client,
:class:`~replaystore.mcp.client.TaskClient`, exported beside this one by
:mod:`replaystore.mcp.client`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Protocol, TypeVar

from ...verdicts import Evidence, Resumption, ResumptionDesyncError, Tombstone, Verdict

__all__ = [
    "DesyncWatch",
    "ResumingSession",
    "desync_error",
    "raise_for_desync",
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


async def raise_for_desync(response: _Response) -> None:
    """Response event hook: raise :class:`ResumptionDesyncError` for a 404 that carries a verdict.

    ``httpx.AsyncClient(event_hooks={"response": [raise_for_desync]})``; the
    exception leaves ``client.get``/``client.stream`` with the verdict and evidence.
    """
    error = await _read_desync(response)
    if error is not None:
        raise error


class DesyncWatch:
    """Remembers the failed resumptions its hook saw, for clients that swallow the exception.

    The SDK's client turns a 404 on its resumption GET into an exception it
    catches and retries, so the verdict never reaches the caller. This hook
    does not raise (raising inside the SDK's tasks would tear its transport
    down); it records the first verdict, and :meth:`pop` hands it over once.
    ``client_factory`` has the signature the SDK's and FastMCP's
    ``httpx_client_factory`` expect.
    """

    def __init__(self) -> None:
        self._seen: ResumptionDesyncError | None = None

    async def hook(self, response: _Response) -> None:
        """Response event hook: record the verdict of a failed resumption."""
        error = await _read_desync(response)
        if error is not None and self._seen is None:
            self._seen = error  # the first verdict is the cause; later 404s follow from it

    def pop(self) -> ResumptionDesyncError | None:
        """The first failed resumption seen since the last call, if any."""
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
        Other options go to the client.
        """
        import httpx2

        from .once import OncePerStream

        options.setdefault("transport", OncePerStream())
        if timeout is None:
            timeout = httpx2.Timeout(30.0, read=300.0)
        client = httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, **options)
        client.event_hooks["response"].append(self.hook)
        return client


class ResumingSession:
    """An MCP client session that re-initializes after a failed resumption.

    ::

        async with ResumingSession(url) as mcp:
            try:
                result = await mcp.call_tool("countdown", {"n": 100})
            except ResumptionDesyncError as exc:
                log.warning("resume failed: %s %s", exc.verdict, exc.resumption.evidence.as_dict())
                # mcp.session is already a fresh, initialized session

    Keyword arguments go to the SDK's ``ClientSession`` (callbacks, timeouts).
    Like the SDK's session, it belongs to the task that entered it: replacing
    a session closes the SDK's transport, whose task group must be left by the
    task that entered it.
    """

    def __init__(self, url: str, **session_options: Any) -> None:
        self.url = url
        self.watch = DesyncWatch()
        self._options = session_options
        self._stack: AsyncExitStack | None = None
        self._session: Any = None

    @property
    def session(self) -> Any:
        """The current, initialized ``mcp.ClientSession``."""
        if self._session is None:
            raise RuntimeError("ResumingSession is not open")
        return self._session

    async def __aenter__(self) -> ResumingSession:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close()

    async def _open(self) -> None:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        stack = AsyncExitStack()
        try:
            http = await stack.enter_async_context(self.watch.client_factory())
            read, write = await stack.enter_async_context(
                streamable_http_client(self.url, http_client=http)
            )
            session = await stack.enter_async_context(ClientSession(read, write, **self._options))
            await session.initialize()
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._session = stack, session

    async def _close(self) -> None:
        stack, self._stack, self._session = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def reinitialize(self) -> None:
        """Drop the current session (best effort) and open a new one."""
        with contextlib.suppress(Exception):  # the old session is gone on the server already
            await self._close()
        self.watch.pop()
        await self._open()

    async def run(self, call: Callable[[Any], Awaitable[T]]) -> T:
        """``await call(session)``; after a failed resumption, a new session and the verdict.

        When the call fails and the server had refused to resume one of this
        session's streams, the session is replaced by a fresh one and
        :class:`ResumptionDesyncError` is raised with the server's verdict and
        evidence, chained to the client's own error. Other failures propagate.
        """
        try:
            return await call(self.session)
        except Exception as exc:
            desync = self.watch.pop()
            if desync is None:
                raise
            await self.reinitialize()
            raise desync from exc

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None, **kw: Any) -> Any:
        """``session.call_tool`` through :meth:`run`."""
        return await self.run(lambda session: session.call_tool(name, arguments, **kw))

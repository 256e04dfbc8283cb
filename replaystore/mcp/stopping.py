"""A replica told to stop drains before its server closes anything: the app's own drain.

A rolling restart (Kubernetes, compose, systemd) sends ``SIGTERM`` and
expects the process to finish what it runs. Left alone, uvicorn and
sse-starlette do the opposite for an MCP server: on the signal sse-starlette
ends every SSE stream at once (a running call's stream included), uvicorn
waits for the connections to close, and only then runs the app's lifespan
shutdown, which stops the tools still running. Every client of a running
call then resumes on another replica and is told its request was lost.

The lifespan shutdown comes too late to drain, so :func:`draining_on_stop`,
entered in the app's lifespan, watches for the stop itself: under uvicorn
(``uvicorn module:app``, ``uvicorn.run(app)``: a ``uvicorn.Server`` whose
signal handlers are installed, found as sse-starlette finds it) it sees the
server's ``should_exit`` as soon as a signal sets it and then:

1. drains (:meth:`ReplaySessionManager.drain`, :meth:`ReplayTasks.drain`):
   no new work (503 with ``Retry-After``, the health check says
   ``draining``), the standalone GET streams closed (their clients resume
   them on another replica, exactly);
2. lets running requests and tasks go on for up to ``seconds``, their
   streams open (sse-starlette's own stop of every stream is held off
   meanwhile); a request that ends in time is answered as usual, and
   uvicorn moves on as soon as no connection is left;
3. when ``seconds`` ran out, lets sse-starlette end the streams still open,
   so that uvicorn runs the lifespan shutdown, which hands over what still
   runs (leases dropped: a client resuming elsewhere is told at once).

Under another server, or a uvicorn server that installed no signal handler
(one run in a thread), nothing is watched: the app stops as before, and the
drain is the caller's (:func:`~replaystore.mcp.manager_of`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from .sessions.manager import ReplaySessionManager

if TYPE_CHECKING:
    from .tasks.extension import ReplayTasks

__all__ = ["draining_on_stop", "stopping_server"]

logger = logging.getLogger("replaystore.mcp")

#: Seconds between two looks at the server's ``should_exit`` (uvicorn's own main loop: 0.1 s).
POLL_SECONDS = 0.1


def stopping_server() -> Any | None:
    """The uvicorn server of this process, found through its ``SIGTERM`` handler (or None).

    uvicorn installs a bound method of its ``Server`` as the handler while
    it serves; sse-starlette finds the server the same way.
    """
    try:
        handler = signal.getsignal(signal.SIGTERM)
    except ValueError:  # pragma: no cover - not a main interpreter
        return None
    server = getattr(handler, "__self__", None)
    return server if hasattr(server, "should_exit") else None


@asynccontextmanager
async def draining_on_stop(
    managers: Sequence[ReplaySessionManager], tasks: ReplayTasks | None, seconds: float
) -> AsyncIterator[None]:
    """While open: when the server is told to stop, drain for ``seconds`` (module docstring)."""
    server = stopping_server()
    if server is None:
        yield
        return
    from sse_starlette.sse import AppStatus

    # sse-starlette would end every stream the moment the signal comes: the
    # drain decides instead, and gives the decision back when it ran out.
    automatic = AppStatus.enable_automatic_graceful_drain
    AppStatus.enable_automatic_graceful_drain = False
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_drain_when_stopped, server, managers, tasks, seconds)
            try:
                yield
            finally:
                group.cancel_scope.cancel()
                if server.should_exit:
                    # The server got to the lifespan shutdown before the watch
                    # saw it stop (nothing was connected): tasks still drain.
                    _drain(managers, tasks, seconds)
    finally:
        AppStatus.enable_automatic_graceful_drain = automatic


def _drain(
    managers: Sequence[ReplaySessionManager], tasks: ReplayTasks | None, seconds: float
) -> None:
    if any(not manager.draining for manager in managers) or (
        tasks is not None and not tasks.draining
    ):
        logger.info("stopping: no new work; running requests and tasks have %gs to finish", seconds)
    if tasks is not None:
        tasks.drain()
    for manager in managers:
        if not manager.draining:
            manager.drain()


async def _drain_when_stopped(
    server: Any,
    managers: Sequence[ReplaySessionManager],
    tasks: ReplayTasks | None,
    seconds: float,
) -> None:
    from sse_starlette.sse import AppStatus

    while not server.should_exit:  # noqa: ASYNC110 - uvicorn sets a flag, no event
        await anyio.sleep(POLL_SECONDS)
    _drain(managers, tasks, seconds)
    await anyio.sleep(seconds)
    logger.info("stopping: the drain ran out; what still runs is handed over")
    # sse-starlette ends the streams of this stopping server (within half a second).
    AppStatus.enable_automatic_graceful_drain = True

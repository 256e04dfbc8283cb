"""The resume lane: a resume goes to its session manager before the app's routing.

A reconnecting client's ``GET`` with ``Last-Event-ID`` is the request a
replica answers most in a reconnect storm, and its answer usually comes from
the store alone (:meth:`~replaystore.mcp.sessions.manager.ReplaySessionManager.answer_unserved`).
Starlette's exception layer and router, and the SDK's ASGI wrappers around
its manager, add nothing to that answer but their cost. So this middleware,
the innermost of the app's, hands such a request straight to the manager
that the app's router would have chosen; whatever the manager leaves to the
SDK goes on down the app as before, marked so that it is not looked at twice.

It steps aside (the request takes the usual way) unless every layer it skips
would have passed the request through unchanged: a ``GET`` on the exact path
of a route whose endpoint is the manager's own ASGI app (a route wrapped for
authentication keeps its wrapper), the first route to match that path, the
app not mounted under a prefix, no request body (the SDK's body limit), and
a protocol version the manager's session transport speaks (the SDK routes
other versions elsewhere).
"""

from __future__ import annotations

from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..http_head import LAST_EVENT_ID, Head
from .manager import ReplaySessionManager

__all__ = ["ResumeLane"]


class ResumeLane:
    """ASGI middleware: a resume is handed to its session manager without routing (see above)."""

    def __init__(self, app: ASGIApp, starlette: Any) -> None:
        self.app = app
        self._starlette = starlette
        self._routes = -1  # how many routes the lanes were found among
        self._lanes: dict[str, ReplaySessionManager] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path"):
            manager = self._manager(scope["path"])
            if manager is not None:
                head = Head(scope)
                if (
                    head.has(LAST_EVENT_ID)
                    and not head.has(b"content-length")
                    and not head.has(b"transfer-encoding")
                    and await manager.answer_resume(head, scope, receive, send)
                ):
                    return
        await self.app(scope, receive, send)

    def _manager(self, path: str) -> ReplaySessionManager | None:
        routes = self._starlette.router.routes
        if len(routes) != self._routes:  # found once, again if routes are added
            self._lanes = _lanes(routes)
            self._routes = len(routes)
        return self._lanes.get(path)


def _lanes(routes: list[Any]) -> dict[str, ReplaySessionManager]:
    """Each exact path the router would give to one of this package's managers directly."""
    lanes: dict[str, ReplaySessionManager] = {}
    for index, route in enumerate(routes):
        if not isinstance(route, Route) or "{" in route.path:
            continue
        endpoint = route.endpoint
        manager = getattr(endpoint, "session_manager", None)
        if type(endpoint) is not StreamableHTTPASGIApp or not isinstance(
            manager, ReplaySessionManager
        ):
            continue
        probe = {"type": "http", "path": route.path, "method": "GET", "root_path": ""}
        if route.matches(probe)[0] is not Match.FULL:
            continue
        if any(earlier.matches(probe)[0] is not Match.NONE for earlier in routes[:index]):
            continue
        lanes[route.path] = manager
    return lanes

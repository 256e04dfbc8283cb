"""The health check's HTTP face: ``GET /healthz`` beside the MCP endpoint.

What the check asks lives with the replica's state
(:meth:`~replaystore.mcp.sessions.manager.ReplaySessionManager.health`); this
module only serves its answer. It is served beside the MCP endpoint, not
through it: no ``Host``, ``Accept`` or session checks apply, so a balancer's
bare check works, and the answer is plain text that is never cached.
"""

from __future__ import annotations

from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

if TYPE_CHECKING:
    from .manager import ReplaySessionManager

__all__ = ["HEALTH_PATH", "add_health_route", "health_endpoint"]

#: Where :func:`streamable_http_app` and ``fastmcp_http_app`` serve the health check.
HEALTH_PATH = "/healthz"


async def health_endpoint(manager: ReplaySessionManager, request: Request) -> Response:
    """200 with ``ok: replica <id>``, or 503 with the reason (``HEAD``: no body)."""
    ok, detail = await manager.health()
    return Response(
        "" if request.method == "HEAD" else detail + "\n",
        status_code=200 if ok else int(HTTPStatus.SERVICE_UNAVAILABLE),
        media_type="text/plain",
        headers={"Cache-Control": "no-store"},
    )


def add_health_route(app: Starlette, manager: ReplaySessionManager) -> None:
    """Serve ``manager``'s health check at :data:`HEALTH_PATH` (``GET`` and ``HEAD``)."""
    endpoint = partial(health_endpoint, manager)
    app.router.routes.append(Route(HEALTH_PATH, endpoint, methods=["GET", "HEAD"]))

"""Which replica a client message belongs to, and ids that say so.

A request runs where its POST landed, but the client's answers to what that
request asked (sampling, elicitation, roots) and its ``notifications/cancelled``
may land on any replica. Server-to-client request ids name the replica that
sent them (``"<n>@<replica>"``, see
:class:`~replaystore.mcp._sdk.overrides.ReplicaDispatcher`), so an answer
is routed by its id alone; a cancellation is routed by the lease of the
request it cancels. Exactly one replica receives each forwarded message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Route", "replica_of", "route", "server_request_id"]

_SEPARATOR = "@"


def server_request_id(number: int, replica: str) -> str:
    """The id of a server-to-client request: its number on ``replica``, and that replica."""
    return f"{number}{_SEPARATOR}{replica}"


def replica_of(request_id: object) -> str | None:
    """The replica that sent a server-to-client request, from its id (None if not one of ours)."""
    if not isinstance(request_id, str) or _SEPARATOR not in request_id:
        return None
    number, _, replica = request_id.rpartition(_SEPARATOR)
    return replica if number.isdigit() and replica else None


@dataclass(frozen=True, slots=True)
class Route:
    """Where a client message goes: the replica named, or (``cancels``) a request's lease holder."""

    replica: str | None = None
    cancels: str | None = None


def route(message: dict[str, Any]) -> Route | None:
    """The route of a POSTed client message that may belong elsewhere, or None (handle it here).

    Tolerant: anything that is not clearly a client answer, a progress
    notification for a server request, or a cancellation is left to the SDK
    (which validates it).
    """
    method = message.get("method")
    if method is None and ("result" in message or "error" in message):
        replica = replica_of(message.get("id"))
        return Route(replica=replica) if replica else None
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    if method == "notifications/progress":
        replica = replica_of(params.get("progressToken"))
        return Route(replica=replica) if replica else None
    if method == "notifications/cancelled" and "id" not in message:
        cancelled = params.get("requestId")
        if isinstance(cancelled, str | int) and not isinstance(cancelled, bool):
            return Route(cancels=str(cancelled))
    return None

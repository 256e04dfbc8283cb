"""The events every store is given: 200-byte JSON-RPC notifications.

The MCP stores take a message object and serialise it themselves; replaystore
and the raw floor take the bytes the SDK would put on the wire. Both forms come
from here so that every store stores the same bytes.
"""

from __future__ import annotations

from functools import cache

from mcp_types import JSONRPCNotification

__all__ = ["PAYLOAD_BYTES", "message", "payload"]

PAYLOAD_BYTES = 200
"""Serialized size of every event."""

_FRAME = len(
    JSONRPCNotification(
        jsonrpc="2.0", method="notifications/message", params={"level": "info", "data": ""}
    ).model_dump_json(by_alias=True)
)


@cache
def message(i: int) -> JSONRPCNotification:
    """A notification whose serialized form is exactly :data:`PAYLOAD_BYTES` long."""
    data = f"{i % 10**8:08d}".ljust(PAYLOAD_BYTES - _FRAME, "x")
    return JSONRPCNotification(
        jsonrpc="2.0", method="notifications/message", params={"level": "info", "data": data}
    )


@cache
def payload(i: int) -> bytes:
    """The wire bytes of :func:`message` (what replaystore and the raw floor store)."""
    return message(i).model_dump_json(by_alias=True).encode()

"""JSON-RPC messages as the store keeps them, and the names of their streams.

One helper answers "is this a response" for the whole package, and one
function maps an SDK stream id (the standalone GET stream, or a request id of
any length) to the sequence name it is stored under, the same on every
replica; :func:`request_id_of` reads the request id back from it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from operator import itemgetter
from typing import TypeGuard

from mcp.server.streamable_http import GET_STREAM_KEY
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCResponse, jsonrpc_message_adapter

from ...verdicts import Event, Replay

__all__ = [
    "GET_STREAM",
    "NO_RESPONSE",
    "decode_message",
    "encode_message",
    "first_response",
    "ids_of",
    "is_response",
    "is_response_payload",
    "payloads_of",
    "request_id_of",
    "response_id",
    "sequence_name",
]

#: The SDK's name for the standalone GET stream of a session (messages tied to no request).
GET_STREAM = GET_STREAM_KEY

#: Longest stream id stored as it is; the store accepts sequence names of up
#: to 256 UTF-8 bytes, and JSON-RPC request ids (the SDK's stream ids) have no
#: length limit.
_LONGEST_PLAIN = 128


def encode_message(message: JSONRPCMessage) -> bytes:
    """The stored form of a message: exactly the JSON the SDK puts in an SSE ``data:`` field."""
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8")


def decode_message(payload: bytes) -> JSONRPCMessage:
    """Parse a stored payload back with the SDK's own JSON-RPC message adapter."""
    return jsonrpc_message_adapter.validate_json(payload, by_name=False)


def is_response(message: object) -> TypeGuard[JSONRPCResponse | JSONRPCError]:
    """True for a JSON-RPC response or error: the message that ends a request's stream."""
    return isinstance(message, JSONRPCResponse | JSONRPCError)


#: How every stored notification begins (:func:`encode_message` writes the
#: fields in the model's order, without spaces): a payload that begins so is
#: no response, told without parsing it.
_NOTIFICATION = b'{"jsonrpc":"2.0","method":'


#: How every stored response and request begins: the id comes next.
_WITH_ID = b'{"jsonrpc":"2.0","id":'
_ID = json.JSONDecoder()
_AFTER_ID = len(_WITH_ID)


def payloads_of(events: Sequence[Event]) -> Sequence[bytes | None]:
    """The stored payloads of events, in order (``None`` for a priming event); read only.

    A replay's own column when the events are one (no event is built for it).
    """
    if type(events) is Replay:
        return events.payloads
    return list(map(_PAYLOAD, events))


def ids_of(events: Sequence[Event]) -> Sequence[str]:
    """The ids of events, in order; read only (a replay's own column, as :func:`payloads_of`)."""
    if type(events) is Replay:
        return events.ids
    return list(map(_ID_OF, events))


_PAYLOAD = itemgetter(3)  # Event.payload
_ID_OF = itemgetter(0)  # Event.event_id


def first_response(payloads: Sequence[bytes]) -> int | None:
    """The index of the first response among stored payloads, or None.

    A replay asks it of every request stream it sends: the notifications,
    nearly all of what a stream holds, are told apart by their beginning all
    at once (one slice each, compared in one ``count``, no Python code per
    payload); only the others are asked :func:`is_response_payload`. A
    stream's response is its last event, so one that holds notifications
    and then one other message is answered without looking further.
    """
    heads = list(map(_HEAD, payloads))
    count = len(heads)
    notes = heads.count(_NOTIFICATION)
    if notes == count:
        return None
    if notes == count - 1 and heads[-1] != _NOTIFICATION:
        return count - 1 if is_response_payload(payloads[-1]) else None
    for index, head in enumerate(heads):
        if head != _NOTIFICATION and is_response_payload(payloads[index]):
            return index
    return None


#: A payload's first bytes, as many as a notification's beginning has.
_HEAD = itemgetter(slice(len(_NOTIFICATION)))


def is_response_payload(payload: bytes) -> bool:
    """:func:`is_response` of a stored payload, without building the SDK's model.

    A replay asks this of every event it sends; the model is built only
    when a message must be handled, not to write it out again as stored.
    """
    if payload.startswith(_NOTIFICATION):
        return False
    if payload.startswith(_WITH_ID):
        # What follows the id says it: a response's result or error, or a request's method.
        end = payload.find(b",", _AFTER_ID)
        if end > _AFTER_ID and payload[_AFTER_ID:end].lstrip(b"-").isdigit():  # a number
            return payload.startswith(b',"result":', end) or payload.startswith(b',"error":', end)
        text = payload.decode("utf-8", "surrogatepass")
        try:
            _, end = _ID.raw_decode(text, len(_WITH_ID))
        except ValueError:
            return False
        return text.startswith(',"result":', end) or text.startswith(',"error":', end)
    try:
        message = json.loads(payload)
    except ValueError:
        return False
    return (
        isinstance(message, dict)
        and "method" not in message
        and "id" in message
        and ("result" in message or "error" in message)
    )


#: What :func:`response_id` gives for a payload that is no response.
NO_RESPONSE = object()


def response_id(payload: bytes) -> object:
    """The id of a stored response, with its JSON type (``0`` or ``"0"``), else :data:`NO_RESPONSE`.

    A stream's name cannot tell the two apart (see :func:`request_id_of`);
    the response stored in it can.
    """
    if not is_response_payload(payload):
        return NO_RESPONSE
    try:
        message = json.loads(payload)
    except ValueError:
        return NO_RESPONSE
    return message.get("id") if isinstance(message, dict) else NO_RESPONSE


def sequence_name(stream_id: str) -> str:
    """The sequence a stream is stored under: itself, or a digest of an overlong id.

    Deterministic, so every replica maps a request id to the same sequence.
    Ids the store cannot name a sequence with (too long, empty, with NUL or
    lone surrogates) become a digest starting with ``#``; a short id that
    starts with ``#`` is hashed as well, so the two kinds never collide.
    """
    raw = stream_id.encode("utf-8", "surrogatepass")
    plain = (
        0 < len(raw) <= _LONGEST_PLAIN
        and not stream_id.startswith("#")
        and "\x00" not in stream_id
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in stream_id)
    )
    if plain:
        return stream_id
    return "#" + hashlib.sha256(raw).hexdigest()


def request_id_of(sequence: str) -> str | int | None:
    """The JSON-RPC id a request stream belongs to, as far as its name tells.

    Stream names are the SDK's ``str(request.id)``: digits were (almost
    always) an integer id. A digest name (an overlong id, see
    :func:`sequence_name`) cannot be reversed: an error answering it then
    carries a null id, which JSON-RPC allows for errors.
    """
    if sequence.startswith("#"):
        return None
    if sequence.isdigit() or (sequence.startswith("-") and sequence[1:].isdigit()):
        return int(sequence)
    return sequence

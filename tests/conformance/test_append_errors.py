"""An append refused for what the session already holds gets its own error class, on every backend.

A sequence-tag collision and a reused idempotency key are both an
``InvalidInputError`` (nothing was stored), each its own subclass so a caller
can tell them from a bad name or payload without reading the message.
"""

from __future__ import annotations

from typing import Any

import pytest

from replaystore import (
    IdempotencyKeyReusedError,
    InvalidInputError,
    ReplayBuffer,
    ReplayStoreError,
    SequenceTagCollisionError,
)
from replaystore.cursor import sequence_tag

from ._support import pos

pytestmark = pytest.mark.anyio

S = "sess-append-errors"


async def _rename_sequence(buffer: ReplayBuffer, session: str, old: str, new: str) -> None:
    """Store ``new`` as the name behind ``old``'s tag: what a 64-bit tag collision looks like.

    Two names with one tag cannot be found by search, so the stored name is
    changed behind the backend's back instead; the next append under ``old``
    then meets a sequence of another name under its tag.
    """
    backend: Any = buffer.backend
    tag = sequence_tag(old)
    if hasattr(backend, "_sessions"):  # memory
        seq = backend._sessions[session].seqs[tag]
        assert seq.name == old
        seq.name = new
        return
    meta = f"{backend.key_base(session)}:m"
    state = await backend.client.hget(meta, f"s:{tag}")
    *numbers, name = state.split(b",", 7)  # the name comes last and may hold commas
    assert name == old.encode()
    await backend.client.hset(meta, f"s:{tag}", b",".join([*numbers, new.encode()]))


async def test_sequence_tag_collision_raises_its_own_error_and_stores_nothing(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    await buf.append(S, "a", b"1")
    await buf.append(S, "b", b"2")
    await _rename_sequence(buf, S, "a", "z")
    with pytest.raises(SequenceTagCollisionError) as raised:
        await buf.append(S, "a", b"3")
    with pytest.raises(SequenceTagCollisionError):
        await buf.append_many(S, "a", [b"3", None], idempotency_key="k")
    error = raised.value
    assert isinstance(error, InvalidInputError) and isinstance(error, ReplayStoreError)
    assert isinstance(error, ValueError)
    assert error.sequence == "a" and "'a'" in str(error)
    info = await buf.session_info(S)
    assert (info.high_water, info.retained) == (2, 2)
    # other sequences are untouched, and the key of the refused batch was not spent
    assert pos(await buf.append(S, "b", b"4", idempotency_key="k")) == 3


async def test_reused_idempotency_key_raises_its_own_error_and_stores_nothing(make_buffer):
    buf = await make_buffer()
    await buf.open_session(S)
    first = await buf.append(S, "q", b"a", idempotency_key="req-1")
    for batch in ([b"a", b"b"], [None, None, None]):
        with pytest.raises(IdempotencyKeyReusedError) as raised:
            await buf.append_many(S, "q", batch, idempotency_key="req-1")
    error = raised.value
    assert isinstance(error, InvalidInputError) and isinstance(error, ReplayStoreError)
    assert error.key == "req-1" and "'req-1'" in str(error)
    # a retry of the first batch still gets its id; nothing else was stored
    assert await buf.append(S, "q", b"a", idempotency_key="req-1") == first
    info = await buf.session_info(S)
    assert (info.high_water, info.retained) == (1, 1)

"""A session's loop ended quietly: its handlers are cancelled, and no task's repr is formatted."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCRequest

from replaystore.mcp._sdk.overrides import ReplicaDispatcher

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_loop_ended_quietly_cancels_its_handlers_as_the_sdk_does() -> None:
    send_in, read = anyio.create_memory_object_stream[Any](0)
    write, _sent = anyio.create_memory_object_stream[Any](10)
    dispatcher = ReplicaDispatcher(read, write)
    running, cancelled = anyio.Event(), anyio.Event()

    async def on_request(ctx: Any, method: str, params: Any) -> dict[str, Any]:
        running.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        return {}  # pragma: no cover

    async def on_notify(ctx: Any, method: str, params: Any) -> None: ...

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(dispatcher.run, on_request, on_notify)
            scope = dispatcher._tg.cancel_scope  # type: ignore[union-attr]
            request = JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/call", params={})
            await send_in.send(SessionMessage(request))
            await running.wait()
            dispatcher.end_quietly()  # as a failed resume does, before the streams close
            await send_in.aclose()
        assert cancelled.is_set()
        assert scope.cancel_called
        # cancelled from a callback, in no task: the reason names none (no repr formatted)
        assert " by " not in (scope._cancel_reason or "")  # type: ignore[attr-defined]


async def test_a_loop_ended_quietly_after_it_stopped_is_left_alone() -> None:
    dispatcher = ReplicaDispatcher(*anyio.create_memory_object_stream[Any](0))  # type: ignore[arg-type]
    dispatcher.end_quietly()  # never ran: nothing to cancel
    await anyio.lowlevel.checkpoint()

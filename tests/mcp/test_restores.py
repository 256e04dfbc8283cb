"""A store that went back in time: Redis restarted from an older snapshot under two replicas.

Real ``replaystore example-server`` processes on a real Redis of the test's
own: a snapshot is taken (``SAVE``), a session is then ended and a task
completes, and Redis is killed and started again from that snapshot. What
ended stays ended and what finished stays finished, on both replicas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis

from replaystore.testing.servers import ServerHandle
from tests.mcp._support import RawSession, spawn_replica, wait_ready
from tests.mcp.tasks._support import Modern, _task_field

pytestmark = pytest.mark.anyio


async def _answered(send: Any) -> httpx.Response:
    """The first answer that is not a 503 (replicas reconnecting to the restarted Redis)."""
    with anyio.fail_after(20):  # a hang guard, not a timing assertion
        while True:
            response: httpx.Response = await send()
            if response.status_code != 503:
                return response
            await anyio.sleep(0.1)


async def _task(client: Modern, task_id: str) -> dict[str, Any]:
    async def send() -> httpx.Response:
        body = {"taskId": task_id, "_meta": client.meta}
        message = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": body}
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tasks/get",
            "Mcp-Name": task_id,
        }
        return await client.http.post(client.url, json=message, headers=headers)

    reply: dict[str, Any] = (await _answered(send)).json()
    assert "result" in reply, reply
    result: dict[str, Any] = reply["result"]
    return result


async def test_after_a_restore_what_ended_stays_ended_on_every_replica(
    own_server: ServerHandle, tmp_path: Path, fresh: httpx.AsyncClient
) -> None:
    """A session ended after the snapshot is refused on both replicas (``store_regressed``);
    a task that completed after it never reads ``working`` again and its tool ran once."""
    store = f"{own_server.url}?prefix=restore:"
    lease = ("--lease-seconds", "1")
    a, b = (spawn_replica(f"restore-{name}", store, tmp_path, *lease) for name in "ab")
    try:
        wait_ready([a, b])
        session = await RawSession(fresh, a.url).initialize()
        on_b = RawSession(fresh, b.url, session_id=session.session_id)
        assert await on_b.ping_status() == 200  # b serves it too
        task_id = (await Modern(fresh, a.url).call("countdown", {"n": 8, "interval_ms": 100}))[
            "taskId"
        ]
        with redis.Redis.from_url(own_server.url) as direct:
            direct.save()  # the snapshot: the session live, the task working
        assert _task_field(own_server.url, task_id, "st") == b"working"  # so it was at the SAVE

        deleted = await fresh.delete(a.url, headers=session.headers())
        assert deleted.status_code == 200
        done = await Modern(fresh, b.url).wait(task_id, "completed", "failed", "cancelled")
        assert done["status"] == "completed", done
        assert await on_b.ping_status() == 404
        await anyio.sleep(1.5)  # each replica's background look reads the newest facts

        await anyio.to_thread.run_sync(lambda: own_server.restart(keep_data=True, save=False))

        for replica in (a, b):
            on = RawSession(fresh, replica.url, session_id=session.session_id)
            _, body = on.request("ping", {})
            answer = await _answered(
                lambda on=on, body=body: fresh.post(on.url, json=body, headers=on.headers())
            )
            assert answer.status_code == 404, (replica.name, answer.text)
            assert "store_regressed" in answer.text, answer.text
        # Two leases and more: a task read as running would lapse and run again by now.
        seen = []
        with anyio.move_on_after(3.0):
            while True:
                for replica in (a, b):
                    seen.append(await _task(Modern(fresh, replica.url), task_id))
                await anyio.sleep(0.2)
        assert {task["status"] for task in seen} == {"failed"}, seen
        assert "store_regressed" in seen[-1]["statusMessage"], seen[-1]
        assert _task_field(own_server.url, task_id, "att") == b"1"  # the tool ran once
    finally:
        a.stop()
        b.stop()

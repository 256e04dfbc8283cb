"""Any replica serves any session: real servers on one real Redis behind a round-robin proxy.

Three ``replaystore example-server`` processes share one Redis URL and
nothing else; a real TCP proxy hands each new connection to the next one, and
every client opens a new connection per request, so an ``initialize``, the
next POST, a reconnect and the client's answer to an elicitation each land on
a different process. The same case runs on FastMCP (three apps built with
``fastmcp_http_app``) and on ``memory://NAME`` (three managers of one process).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitRequestParams, ElicitResult

from replaystore import ReplayBuffer
from replaystore.mcp.replicas.forwarding import replica_of
from replaystore.testing.proxy import TcpProxy
from replaystore.testing.servers import ServerHandle
from tests.mcp._support import (
    SSE,
    ProxiedReplicas,
    RawSession,
    no_keepalive_client,
    position,
    progress_of,
    result_text,
    spawn_many,
    spawn_replica,
    sse_events,
    wait_ready,
)

pytestmark = pytest.mark.anyio

#: Lease of the replicas started here: how long a request of a killed replica stays unanswered.
LEASE_SECONDS = 2.0


ReplicaSet = ProxiedReplicas


@pytest.fixture(scope="module")
def replica_sets(
    mcp_redis: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ReplicaSet]]:
    """``sdk``: three processes on Redis; ``fastmcp`` and ``memory``: three apps of one process."""
    logs = tmp_path_factory.mktemp("replicas")
    store = f"{mcp_redis.url}?prefix=rr:"
    lease = ("--lease-seconds", str(LEASE_SECONDS))
    sdk = [spawn_replica(f"replica-{i}", store, logs, *lease) for i in range(3)]
    fastmcp = spawn_many(
        "fastmcp-replicas",
        {f"fastmcp-{i}": ("fastmcp", f"{mcp_redis.url}?prefix=rf:", 10_000) for i in range(3)},
        logs,
    )
    memory = spawn_many(
        "memory-replicas",
        {f"memory-{i}": ("sdk", "memory://replicas", 10_000) for i in range(3)},
        logs,
    )
    everything = [*sdk, *fastmcp.values(), *memory.values()]
    sets: dict[str, ReplicaSet] = {}
    try:
        wait_ready(everything)
        for name, servers in (
            ("sdk", sdk),
            ("fastmcp", list(fastmcp.values())),
            ("memory", list(memory.values())),
        ):
            proxy = TcpProxy([("127.0.0.1", s.port) for s in servers]).start()
            sets[name] = ReplicaSet(name, servers, proxy)
        yield sets
    finally:
        for replica_set in sets.values():
            replica_set.proxy.stop()
        for server in everything:
            server.stop()


@pytest.fixture(params=["sdk", "fastmcp", "memory"])
def any_set(request: pytest.FixtureRequest, replica_sets: dict[str, ReplicaSet]) -> ReplicaSet:
    return replica_sets[request.param]


# ---------------------------------------------------------------- the SDK's own client


async def test_sdk_client_round_robin_every_progress_once(any_set: ReplicaSet) -> None:
    """Server-closed streams resumed on whatever replica the proxy picks: each notification once."""
    logs: list[str] = []
    five = anyio.Event()

    async def on_log(params: Any) -> None:
        logs.append(str(params.data))
        if len(logs) == 5:
            five.set()

    async with (
        streamable_http_client(any_set.url, http_client=no_keepalive_client()) as (read, write),
        ClientSession(read, write, logging_callback=on_log) as session,
    ):
        await session.initialize()
        for _ in range(3):
            progress: list[float] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append(value)  # noqa: B023 - consumed before the next iteration

            with anyio.fail_after(30):
                result = await session.call_tool(
                    "countdown",
                    {"n": 8, "interval_ms": 10, "close_after": 3},
                    progress_callback=on_progress,
                )
            assert result.content[0].text == "done 8"  # type: ignore[union-attr]
            assert progress == [float(i) for i in range(1, 9)]
        # The standalone GET stream, attached on one replica, fed by another.
        result = await session.call_tool("broadcast", {"n": 5})
        assert result.content[0].text == "sent 5"  # type: ignore[union-attr]
        with anyio.fail_after(15):
            await five.wait()
    assert logs == [f"broadcast {i}/5" for i in range(1, 6)]


async def test_sdk_client_elicitation_answer_lands_anywhere(any_set: ReplicaSet) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"name": f"Ada{len(asked)}"})

    async with (
        streamable_http_client(any_set.url, http_client=no_keepalive_client()) as (read, write),
        ClientSession(read, write, elicitation_callback=on_elicit) as session,
    ):
        await session.initialize()
        for i in range(1, 4):
            with anyio.fail_after(30):
                result = await session.call_tool("ask", {"question": f"name {i}?"})
            assert result.content[0].text == f"hello Ada{i}"  # type: ignore[union-attr]
    assert asked == ["name 1?", "name 2?", "name 3?"]


# ---------------------------------------------------------------- raw clients


async def test_client_dropped_streams_resume_exactly_once_on_other_replicas(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient
) -> None:
    """The client drops its connection again and again; each resume lands on the next replica."""
    proxy_url = replica_sets["sdk"].url
    session = await RawSession(fresh, proxy_url).initialize()
    request_id, body = session.call("countdown", {"n": 30, "interval_ms": 15}, token="t")
    seen: list[SSE] = []
    result: str | None = None
    with anyio.fail_after(60):
        async with session.post(body) as response:
            assert response.status_code == 200
            async for event in sse_events(response):
                seen.append(event)
                if sum(progress_of(e) is not None for e in seen) >= 3:
                    break  # drop the connection mid-stream
        while result is None:
            last = next(e.id for e in reversed(seen) if e.id)
            async with session.get(last) as response:
                assert response.status_code == 200, await response.aread()
                got = 0
                async for event in sse_events(response):
                    seen.append(event)
                    result = result_text(event, request_id)
                    got += progress_of(event) is not None
                    if result is not None or got >= 4:
                        break
    assert result == "done 30"
    progress = [p for p in (progress_of(e) for e in seen) if p is not None]
    assert progress == [float(i) for i in range(1, 31)]
    ids = [position(e.id) for e in seen if e.id]
    assert ids == sorted(ids) and len(ids) == len(set(ids))


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18"])
async def test_older_protocol_revisions_resume_on_other_replicas(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient, version: str
) -> None:
    """Before 2025-11-25 there are no priming events; messages still resume anywhere."""
    session = await RawSession(fresh, replica_sets["sdk"].url, version=version).initialize()
    request_id, body = session.call("countdown", {"n": 12, "interval_ms": 20}, token="o")
    progress: list[float] = []
    last = ""
    text = None
    with anyio.fail_after(30):
        async with session.post(body) as response:
            async for event in sse_events(response):
                assert not event.priming
                last = event.id or last
                if (value := progress_of(event)) is not None:
                    progress.append(value)
                if len(progress) == 4:
                    break
        while text is None:
            async with session.get(last) as response:
                assert response.status_code == 200, await response.aread()
                async for event in sse_events(response):
                    assert not event.priming
                    last = event.id or last
                    if (value := progress_of(event)) is not None:
                        progress.append(value)
                    if (text := result_text(event, request_id)) is not None:
                        break
    assert text == "done 12"
    assert progress == [float(i) for i in range(1, 13)]


async def test_get_stream_on_one_replica_tails_appends_of_another(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient
) -> None:
    a, b = replica_sets["sdk"].replicas[:2]
    session = await RawSession(fresh, a.url).initialize()
    received: list[str] = []
    on_b = RawSession(fresh, b.url, session_id=session.session_id, next_id=50)
    with anyio.fail_after(30):
        async with session.get() as response:
            assert response.status_code == 200
            events = sse_events(response)
            first = await anext(events)
            assert first.priming and first.id  # a resumable cursor at once
            assert await on_b.run_tool("broadcast", {"n": 6}) == "sent 6"
            async for event in events:
                if event.message is not None:
                    received.append(str(event.message["params"]["data"]))
                if len(received) == 6:
                    break
    assert received == [f"broadcast {i}/6" for i in range(1, 7)]


async def test_get_stream_dropped_and_resumed_through_the_proxy_exactly_once(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient
) -> None:
    """The standalone stream, read in pieces on whatever replica the proxy picks."""
    session = await RawSession(fresh, replica_sets["sdk"].url).initialize()
    received: list[str] = []
    last: str | None = None
    with anyio.fail_after(30):
        async with session.get() as response:
            assert response.status_code == 200
            events = sse_events(response)
            first = await anext(events)
            last = first.id
            assert await session.run_tool("broadcast", {"n": 12}) == "sent 12"
            async for event in events:
                last = event.id or last
                if event.message is not None:
                    received.append(str(event.message["params"]["data"]))
                if len(received) == 3:
                    break  # the client drops the connection
        while len(received) < 12:
            async with session.get(last) as response:
                assert response.status_code == 200, await response.aread()
                got = 0
                async for event in sse_events(response):
                    last = event.id or last
                    if event.message is not None:
                        received.append(str(event.message["params"]["data"]))
                        got += 1
                    if got == 4 or len(received) == 12:
                        break
    assert received == [f"broadcast {i}/12" for i in range(1, 13)]


async def test_a_resume_on_another_replica_takes_the_stream_over(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient
) -> None:
    """The original POST connection on A ends once B carries its stream; B gets the rest once."""
    a, b = replica_sets["sdk"].replicas[:2]
    session = await RawSession(fresh, a.url).initialize()
    on_b = RawSession(fresh, b.url, session_id=session.session_id)
    request_id, body = session.call("countdown", {"n": 40, "interval_ms": 25}, token="k")
    on_a: list[float] = []
    rest: list[float] = []
    text = None
    with anyio.fail_after(30):
        async with session.post(body) as original:
            events = sse_events(original)
            last = ""
            async for event in events:
                last = event.id or last
                if (value := progress_of(event)) is not None:
                    on_a.append(value)
                if len(on_a) == 3:
                    break
            async with on_b.get(last) as resumed:
                assert resumed.status_code == 200
                # The old connection is closed by A: its stream ends without the result.
                async for event in events:
                    if (value := progress_of(event)) is not None:
                        on_a.append(value)
                    assert result_text(event, request_id) is None
                async for event in sse_events(resumed):
                    if (value := progress_of(event)) is not None:
                        rest.append(value)
                    if (text := result_text(event, request_id)) is not None:
                        break
    assert text == "done 40"
    # Everything after the resumed cursor, exactly once, on the new connection.
    assert rest == [float(i) for i in range(4, 41)]
    assert on_a[:3] == [1.0, 2.0, 3.0]


async def test_elicitation_answer_is_forwarded_to_the_replica_running_the_call(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient
) -> None:
    a, b = replica_sets["sdk"].replicas[:2]
    session = await RawSession(fresh, a.url).initialize()
    on_b = RawSession(fresh, b.url, session_id=session.session_id)
    request_id, body = session.call("ask", {"question": "who?"})
    with anyio.fail_after(30):
        async with session.post(body) as response:
            events = sse_events(response)
            asked = None
            async for event in events:
                if event.message and event.message.get("method") == "elicitation/create":
                    asked = event.message
                    break
            assert asked is not None
            assert replica_of(asked["id"]) is not None  # the id names the replica asking
            answer = {
                "jsonrpc": "2.0",
                "id": asked["id"],
                "result": {"action": "accept", "content": {"name": "Grace"}},
            }
            forwarded = await fresh.post(b.url, json=answer, headers=on_b.headers())
            assert forwarded.status_code == 202
            text = None
            async for event in events:
                text = result_text(event, request_id)
                if text is not None:
                    break
    assert text == "hello Grace"


async def test_cancellation_is_forwarded_to_the_replica_running_the_call(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient
) -> None:
    a, b = replica_sets["sdk"].replicas[:2]
    session = await RawSession(fresh, a.url).initialize()
    on_b = RawSession(fresh, b.url, session_id=session.session_id)
    request_id, body = session.call("countdown", {"n": 2000, "interval_ms": 20}, token="c")
    with anyio.fail_after(30):
        async with session.post(body) as response:
            events = sse_events(response)
            async for event in events:
                if progress_of(event) == 2.0:
                    break
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": request_id, "reason": "enough"},
            }
            sent = await fresh.post(b.url, json=cancel, headers=on_b.headers())
            assert sent.status_code == 202
            final = None
            async for event in events:
                message = event.message
                if message and message.get("id") == request_id:
                    final = message
                    break
    assert final is not None and final["error"]["message"] == "Request cancelled"


async def test_delete_on_one_replica_ends_the_session_on_all(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient
) -> None:
    a, b, c = replica_sets["sdk"].replicas
    session = await RawSession(fresh, a.url).initialize()
    on_b = RawSession(fresh, b.url, session_id=session.session_id)
    on_c = RawSession(fresh, c.url, session_id=session.session_id)
    assert await on_c.ping_status() == 200  # c adopts the session
    with anyio.fail_after(30):
        async with session.get() as response:  # a live connection held by a
            events = sse_events(response)
            await anext(events)
            deleted = await fresh.delete(b.url, headers=on_b.headers())
            assert deleted.status_code == 200
            async for _ in events:  # ends when a learns of the DELETE
                pass
    for replica in (session, on_b, on_c):
        assert await replica.ping_status() == 404


async def test_a_session_the_store_does_not_know_is_404_everywhere(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient
) -> None:
    for replica in replica_sets["sdk"].replicas:
        forged = RawSession(fresh, replica.url, session_id="f" * 32)
        assert await forged.ping_status() == 404
        async with forged.get("0123456789ab-1") as response:
            assert response.status_code == 404


async def test_a_record_whose_events_are_gone_is_not_adopted(
    replica_sets: dict[str, ReplicaSet], mcp_redis: ServerHandle, fresh: httpx.AsyncClient
) -> None:
    """Only a session the store knows to be live is adopted, whatever record is left over."""
    a, b, _ = replica_sets["sdk"].replicas
    session = await RawSession(fresh, a.url).initialize()
    async with ReplayBuffer.from_url(mcp_redis.url, prefix="rr:") as buffer:
        assert await buffer.close_session(session.session_id)  # the events end, not the record
    assert await RawSession(fresh, b.url, session_id=session.session_id).ping_status() == 404


# ---------------------------------------------------------------- a replica dies


async def test_replica_killed_mid_call(mcp_redis: ServerHandle, tmp_path: Path) -> None:
    """SIGKILL mid-call: the resumed stream ends with an error; the session lives on."""
    store = f"{mcp_redis.url}?prefix=rk:"
    lease = ("--lease-seconds", str(LEASE_SECONDS))
    doomed, survivor = (spawn_replica(f"kill-{i}", store, tmp_path, *lease) for i in range(2))
    try:
        wait_ready([doomed, survivor])
        async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as http:
            victim = await RawSession(http, doomed.url).initialize()
            bystander = await RawSession(http, survivor.url).initialize()
            request_id, body = victim.call("countdown", {"n": 10_000, "interval_ms": 20}, "v")
            other_id, other_body = bystander.call("countdown", {"n": 60, "interval_ms": 20}, "b")
            other_progress: list[float] = []
            other_result: list[str] = []

            async def bystander_call() -> None:
                async with bystander.post(other_body) as response:
                    async for event in sse_events(response):
                        if (value := progress_of(event)) is not None:
                            other_progress.append(value)
                        if (text := result_text(event, other_id)) is not None:
                            other_result.append(text)
                            return

            async with anyio.create_task_group() as tg:
                tg.start_soon(bystander_call)
                last = ""
                with anyio.fail_after(30):
                    async with victim.post(body) as response:
                        async for event in sse_events(response):
                            if event.id:
                                last = event.id
                            if progress_of(event) == 3.0:
                                doomed.proc.send_signal(signal.SIGKILL)
                                doomed.proc.wait(10)
                                break
                on_survivor = RawSession(
                    http, survivor.url, session_id=victim.session_id, next_id=victim.next_id
                )
                final: dict[str, Any] | None = None
                with anyio.fail_after(30):  # a hang guard, not a timing assertion
                    while final is None:
                        async with on_survivor.get(last) as response:
                            assert response.status_code == 200, await response.aread()
                            async for event in sse_events(response):
                                if event.id:
                                    last = event.id
                                message = event.message
                                if message and message.get("id") == request_id:
                                    final = message
                                    break
                assert "error" in final
                assert (
                    final["error"]["message"]
                    == "request lost: the server replica that took it stopped, "
                    "or lost its store, before answering it"
                )
                # The session itself lives on at the survivor.
                assert (
                    await on_survivor.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"
                )
        assert other_result == ["done 60"]
        assert other_progress == [float(i) for i in range(1, 61)]
    finally:
        doomed.stop()
        survivor.stop()


async def test_a_replica_stopped_gracefully_hands_its_requests_over_at_once(
    mcp_redis: ServerHandle, tmp_path: Path
) -> None:
    """SIGTERM mid-call: the lease is dropped at shutdown; another replica answers at once."""
    store = f"{mcp_redis.url}?prefix=rg:"
    long_lease = ("--lease-seconds", "120")  # far longer than the hang guard below
    stopping, survivor = (
        spawn_replica(f"stop-{i}", store, tmp_path, *long_lease) for i in range(2)
    )
    try:
        wait_ready([stopping, survivor])
        async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as http:
            session = await RawSession(http, stopping.url).initialize()
            request_id, body = session.call("countdown", {"n": 10_000, "interval_ms": 20}, "g")
            last = ""
            with anyio.fail_after(30):
                async with session.post(body) as response:
                    async for event in sse_events(response):
                        last = event.id or last
                        if progress_of(event) == 3.0:
                            break
                stopping.proc.send_signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(stopping.proc.wait)
            on_survivor = RawSession(http, survivor.url, session_id=session.session_id)
            final: dict[str, Any] | None = None
            with anyio.fail_after(30):  # well inside the 120 s lease
                while final is None:
                    async with on_survivor.get(last) as response:
                        assert response.status_code == 200, await response.aread()
                        async for event in sse_events(response):
                            last = event.id or last
                            message = event.message
                            if message and message.get("id") == request_id:
                                final = message
                                break
            assert (
                final["error"]["message"]
                == "request lost: the server replica that took it stopped, "
                "or lost its store, before answering it"
            )
    finally:
        stopping.stop()
        survivor.stop()


# ---------------------------------------------------------------- a request sent again


def _progress_and_ids(events: list[SSE]) -> tuple[list[float], list[str]]:
    """The progress values and the ids of the stored messages of one answer."""
    progress = [value for event in events if (value := progress_of(event)) is not None]
    ids = [event.id for event in events if event.message and event.id]
    return progress, ids


async def _read_answer(raw: RawSession, body: dict[str, Any], request_id: int) -> list[SSE]:
    """POST ``body`` and read its SSE answer up to the request's response."""
    events: list[SSE] = []
    with anyio.fail_after(30):  # a hang guard
        async with raw.post(body) as response:
            assert response.status_code == 200, await response.aread()
            async for event in sse_events(response):
                events.append(event)
                if event.message and event.message.get("id") == request_id:
                    return events
    raise AssertionError(f"the answer ended without the response: {events}")


async def test_a_request_sent_twice_to_two_replicas_runs_once(
    any_set: ReplicaSet, fresh: httpx.AsyncClient
) -> None:
    """The same POST at once on two replicas, then again later: one run, one result for all."""
    a, b, c = any_set.replicas
    session = await RawSession(fresh, a.url).initialize()
    on_b = RawSession(fresh, b.url, session_id=session.session_id)
    on_c = RawSession(fresh, c.url, session_id=session.session_id)
    request_id, body = session.call("countdown", {"n": 20, "interval_ms": 20}, "twice")
    answers: dict[str, list[SSE]] = {}

    async def send(name: str, raw: RawSession) -> None:
        answers[name] = await _read_answer(raw, body, request_id)

    async with anyio.create_task_group() as tg:
        tg.start_soon(send, "a", session)
        tg.start_soon(send, "b", on_b)
    answers["c"] = await _read_answer(on_c, body, request_id)  # after the response
    runs = {name: _progress_and_ids(events) for name, events in answers.items()}
    for name, events in answers.items():
        assert runs[name][0] == [float(i) for i in range(1, 21)], name
        final = events[-1].message
        assert final is not None and final["result"]["content"][0]["text"] == "done 20", name
    # The very same stored events: the tool ran once (two runs store two interleaved sets).
    assert runs["a"][1] == runs["b"][1] == runs["c"][1]
    # A new request id runs as usual.
    on_b.next_id = session.next_id
    assert await on_b.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"


async def test_a_request_whose_replica_was_killed_sent_again_is_answered_lost(
    mcp_redis: ServerHandle, tmp_path: Path
) -> None:
    """SIGKILL mid-call, the POST sent again elsewhere: "request lost", never a second run."""
    store = f"{mcp_redis.url}?prefix=ra:"
    lease = ("--lease-seconds", str(LEASE_SECONDS))
    doomed, survivor = (spawn_replica(f"again-{i}", store, tmp_path, *lease) for i in range(2))
    try:
        wait_ready([doomed, survivor])
        async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as http:
            session = await RawSession(http, doomed.url).initialize()
            request_id, body = session.call("countdown", {"n": 10_000, "interval_ms": 20}, "k")
            with anyio.fail_after(30):
                async with session.post(body) as response:
                    async for event in sse_events(response):
                        if progress_of(event) == 3.0:
                            doomed.proc.send_signal(signal.SIGKILL)
                            doomed.proc.wait(10)
                            break
            on_survivor = RawSession(
                http, survivor.url, session_id=session.session_id, next_id=session.next_id
            )
            events = await _read_answer(on_survivor, body, request_id)
            progress, _ = _progress_and_ids(events)
            final = events[-1].message
            assert final is not None
            assert (
                final["error"]["message"]
                == "request lost: the server replica that took it stopped, "
                "or lost its store, before answering it"
            )
            assert progress[:3] == [1.0, 2.0, 3.0]
            assert progress == [float(i) for i in range(1, len(progress) + 1)]
            # What the store holds: one answer, and no progress after the kill's.
            async with ReplayBuffer.from_url(store) as buffer:
                info = await buffer.session_info(session.session_id)
                assert info is not None
                stored = await buffer.resolve_and_replay(
                    session.session_id, info.origin, str(request_id)
                )
            assert stored.ok
            messages = [json.loads(e.payload) for e in stored.events if e.payload is not None]
            assert [m for m in messages if "id" in m] == [final]
            assert len(messages) == len(progress) + 1
            assert await on_survivor.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"
    finally:
        doomed.stop()
        survivor.stop()


async def test_a_session_ended_after_another_replica_resumed_it_is_404_there_too(
    replica_sets: dict[str, ReplicaSet], fresh: httpx.AsyncClient
) -> None:
    """A replica that served resumes of a session from the store (and kept its creator)
    still learns from the store that it ended: a resume after the DELETE is 404."""
    a, b, _ = replica_sets["sdk"].replicas
    session = await RawSession(fresh, a.url).initialize()
    ids: list[str] = []
    _, call = session.call("countdown", {"n": 3, "interval_ms": 0}, token="t")
    async with session.post(call) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                ids.append(line[3:].strip())
    on_b = RawSession(fresh, b.url, session_id=session.session_id)
    for _ in range(2):  # the second one finds the session's creator known on b
        async with on_b.get(ids[1]) as resumed:
            assert resumed.status_code == 200
            assert "done" in (await resumed.aread()).decode()
    deleted = await fresh.delete(a.url, headers=session.headers())
    assert deleted.status_code == 200
    async with on_b.get(ids[1]) as gone:
        assert gone.status_code == 404

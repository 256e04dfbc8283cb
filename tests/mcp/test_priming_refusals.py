"""Redis refusing a POST's first writes after its checks passed: a 503, or an answer in the stream.

Two example-server replicas on a Redis of this module alone. The refusals
are real (``NOPERM``), made exact by an ACL that grants every key but the
ones a test names: Redis then takes everything a request writes before it
(the session, the request's lease) and refuses the one write that follows.

- A request's lease is taken, then its priming event is refused: the client
  gets ``503`` with ``Retry-After`` naming what Redis said, before any
  ``200``; the lease is given back, so the same request sent again once
  Redis takes writes runs, once, and is answered.
- An ``initialize`` whose priming event is refused, its session just opened:
  ``503`` alike.
- An ``initialize`` whose session record is refused (the write after its
  response started): the response is the request's JSON-RPC error naming
  the refusal, in the stream, which ends cleanly; a new ``initialize``
  then works.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import anyio
import httpx
import pytest
import redis

from replaystore.backends.redis import keys
from replaystore.cursor import Cursor, sequence_tag
from replaystore.mcp.sessions.messages import sequence_name
from replaystore.testing.mcp import initialize_message
from replaystore.testing.servers import ServerHandle
from replaystore.testing.sse import sse_events
from tests.mcp._support import (
    RawSession,
    ServerProcess,
    progress_of,
    replica_pair,
    result_text,
)

pytestmark = pytest.mark.anyio

PREFIX = "pw:"
#: What a client is told of Redis refusing a key to the ACL user.
FORBIDDEN = "redis forbids it (ACL)"


@pytest.fixture(scope="module")
def replicas(
    store: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    logs = tmp_path_factory.mktemp("priming-refusals")
    with replica_pair(f"{store.url}?prefix={PREFIX}", logs) as started:
        yield started


def _admin(store: ServerHandle) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=store.ports[0], socket_timeout=5)


def _glob(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return "".join("\\" + c if c in "*?[]\\^-" else c for c in text)


def _all_but(key: str) -> list[str]:
    """Glob patterns matching every key name except ``key`` (an ACL grants patterns only)."""
    shorter = [_glob(key[:i]) for i in range(1, len(key))]
    differing = [f"{_glob(key[:i])}[^{_glob(key[i])}]*" for i in range(len(key))]
    return [*shorter, *differing, f"{_glob(key)}?*"]


def _all_not_ending_with(suffix: str) -> list[str]:
    """Glob patterns matching every key name that does not end with ``suffix``."""
    shorter = ["?" * n for n in range(1, len(suffix))]
    differing = [
        f"*[^{_glob(suffix[-i])}]{_glob(suffix[len(suffix) - i + 1 :])}"
        for i in range(1, len(suffix) + 1)
    ]
    return [*shorter, *differing]


@contextlib.contextmanager
def _granted_only(store: ServerHandle, patterns: list[str]) -> Iterator[None]:
    """The replicas' user (Redis's default user) may use only keys matching ``patterns``."""
    admin = _admin(store)
    admin.execute_command("ACL", "SETUSER", "default", "resetkeys", *[f"~{p}" for p in patterns])  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        admin.execute_command("ACL", "SETUSER", "default", "resetkeys", "allkeys")  # type: ignore[no-untyped-call]
        admin.close()


def _refused(response: httpx.Response) -> None:
    """503 before any 200, Retry-After, and the JSON-RPC error naming what Redis said."""
    assert response.status_code == 503, (response.status_code, response.text)
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert FORBIDDEN in error["message"], error
    assert error["data"]["reason"] == "storage_error", error
    assert error["data"]["store"] == "noperm", error


@pytest.mark.parametrize("where", ["serving", "adopting"])
async def test_a_priming_event_refused_after_the_lease_is_503_and_the_retry_runs_once(
    where: str, replicas: list[ServerProcess], store: ServerHandle, http: httpx.AsyncClient
) -> None:
    a, b = replicas
    session = await RawSession(http, a.url).initialize()
    target = a if where == "serving" else b  # b adopts the session from the store
    client = RawSession(http, target.url, session.session_id, next_id=session.next_id)
    request_id, body = client.call("countdown", {"n": 3, "interval_ms": 0}, token="t")
    stream = sequence_name(str(request_id))
    base = keys.base(PREFIX, session.session_id)
    events_key = keys.sequence(base, sequence_tag(stream))
    lease_key = keys.registry_lease(base, stream)
    admin = _admin(store)
    # Every write before the stream's first event is granted (the lease
    # among them); the stream's list, which its priming event creates, is not.
    with _granted_only(store, _all_but(events_key)):
        with anyio.fail_after(15):
            async with client.post(body) as response:
                await response.aread()
        _refused(response)
        assert admin.exists(lease_key) == 0  # given back: the retry runs the request
    assert admin.exists(events_key) == 0
    # Redis takes writes again: the same request, sent again, runs and is answered.
    with anyio.fail_after(15):
        async with client.post(body) as response:
            assert response.status_code == 200, await response.aread()
            events = [event async for event in sse_events(response)]
    assert result_text(events[-1], request_id) == "done 3", events
    assert events[0].priming and events[0].id, events
    # One priming event, the one sent: the stream's events are the ones on the wire.
    assert [Cursor.parse(e.id).ordinal for e in events if e.id] == [0, 1, 2, 3, 4], events
    # Run once: its stream, read back from the store, holds one run's events.
    with anyio.fail_after(15):
        async with session.get(events[0].id) as response:
            assert response.status_code == 200, await response.aread()
            replayed = [event async for event in sse_events(response)]
    progress = [p for p in map(progress_of, replayed) if p is not None]
    assert progress == [1.0, 2.0, 3.0], replayed
    assert [result_text(e, request_id) for e in replayed if e.message and "id" in e.message] == [
        "done 3"
    ], replayed
    assert await client.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"
    admin.close()
    for server in (a, b):
        log = server.log_tail(400)
        assert "Traceback" not in log and "without completing response" not in log, log


async def test_an_initialize_whose_priming_event_is_refused_is_503(
    replicas: list[ServerProcess], store: ServerHandle, http: httpx.AsyncClient
) -> None:
    """The session is opened, then its ``initialize`` stream's first event is refused: 503."""
    a, _ = replicas
    await RawSession(http, a.url).initialize()  # an earlier refusal's deeper check is done
    fresh = RawSession(http, a.url)
    first = f":q:{sequence_tag(sequence_name('0'))}"  # initialize's stream, in any session
    with _granted_only(store, _all_not_ending_with(first)):
        with anyio.fail_after(15):
            async with http.stream(
                "POST", a.url, json=initialize_message(fresh.version), headers=fresh.headers()
            ) as response:
                await response.aread()
        _refused(response)
    again = await RawSession(http, a.url).initialize()
    assert await again.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"
    assert "Traceback" not in a.log_tail(400), a.log_tail(400)


async def test_a_refused_session_record_answers_initialize_in_its_stream(
    replicas: list[ServerProcess], store: ServerHandle, http: httpx.AsyncClient
) -> None:
    """The record is written once ``initialize``'s response is under way: the answer is an error.

    The session is opened and the request's priming event stored before the
    ``200``; Redis refuses the next write, the session's record (the one key
    ending ``:mcp``), which comes with the response. The client gets the
    request's JSON-RPC error naming the refusal in the stream, which ends
    as a request stream ends (no cut response), and initializes again.
    """
    a, _ = replicas
    await RawSession(http, a.url).initialize()  # an earlier refusal's deeper check is done
    fresh = RawSession(http, a.url)
    with _granted_only(store, _all_not_ending_with(":mcp")):
        with anyio.fail_after(15):
            async with http.stream(
                "POST", a.url, json=initialize_message(fresh.version), headers=fresh.headers()
            ) as response:
                assert response.status_code == 200, await response.aread()
                events = [event async for event in sse_events(response)]
    assert events[0].priming and events[0].id, events
    answer = events[-1].message
    assert answer is not None and answer.get("id") == 0, events
    assert FORBIDDEN in answer["error"]["message"], answer
    assert answer["error"]["data"]["store"] == "noperm", answer
    again = await RawSession(http, a.url).initialize()
    assert await again.run_tool("countdown", {"n": 2, "interval_ms": 0}) == "done 2"
    assert "Traceback" not in a.log_tail(400), a.log_tail(400)

"""Session views in-process (no HTTP): scoping, encoding, the seam, the GET mark."""

from __future__ import annotations

import json

import anyio
import anyio.lowlevel
import pytest
from mcp.server.streamable_http import EventStore
from mcp_types import (
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCResponse,
)

from replaystore import ReplayBuffer, ResumptionDesyncError, Verdict
from replaystore.cursor import Cursor
from replaystore.mcp import CountingObserver, PrometheusObserver, ReplayEventStore
from replaystore.mcp.sessions.event_store import SessionView
from replaystore.mcp.sessions.messages import (
    GET_STREAM,
    decode_message,
    encode_message,
    sequence_name,
)
from replaystore.mcp.sessions.tail import Tail

pytestmark = pytest.mark.anyio


def note(i: int) -> JSONRPCMessage:
    return JSONRPCNotification(
        jsonrpc="2.0",
        method="notifications/progress",
        params={"progressToken": "t", "progress": i, "message": f"step {i} ü"},
    )


def response(request_id: int) -> JSONRPCMessage:
    return JSONRPCResponse(jsonrpc="2.0", id=request_id, result={"ok": True})


def make_store(max_events: int = 100) -> tuple[ReplayEventStore, CountingObserver]:
    observer = CountingObserver()
    buffer = ReplayBuffer.from_url("memory://", max_events=max_events)
    return ReplayEventStore(buffer, observer=observer), observer


async def collect(view: SessionView, last_event_id: str) -> tuple[str | None, list[str]]:
    sent: list[str] = []

    async def send(event: object) -> None:
        sent.append(encode_message(event.message).decode())  # type: ignore[attr-defined]

    stream = await view.replay_events_after(last_event_id, send)
    return stream, sent


def test_messages_round_trip_byte_for_byte() -> None:
    for message in (note(1), response(7)):
        payload = encode_message(message)
        assert payload == message.model_dump_json(by_alias=True, exclude_unset=True).encode()
        assert decode_message(payload) == message


async def test_sdk_api_replays_one_stream_and_skips_priming() -> None:
    store, observer = make_store()
    view = store.for_session("s1")
    priming = await view.store_event("1", None)
    ids = [await view.store_event("1", note(i)) for i in range(3)]
    await view.store_event("2", note(99))  # another stream of the same session
    await view.store_event("1", response(1))
    stream, sent = await collect(view, priming)
    assert stream == "1"
    assert sent == [encode_message(m).decode() for m in (note(0), note(1), note(2), response(1))]
    stream, sent = await collect(view, ids[1])
    assert sent == [encode_message(m).decode() for m in (note(2), response(1))]
    assert observer.verdicts == {"resumed": 2}
    assert observer.replayed == 6


async def test_two_sessions_with_the_same_stream_names_are_separate() -> None:
    store, observer = make_store()
    a, b = store.for_session("A"), store.for_session("B")
    a_ids = [await a.store_event("1", note(i)) for i in range(2)]
    b_ids = [await b.store_event("1", note(10 + i)) for i in range(2)]
    epochs = {Cursor.parse(i).epoch for i in a_ids}
    assert epochs.isdisjoint(Cursor.parse(i).epoch for i in b_ids)
    _, sent = await collect(a, a_ids[0])
    assert sent == [encode_message(note(1)).decode()]
    with pytest.raises(ResumptionDesyncError) as caught:
        await collect(b, a_ids[0])
    assert caught.value.verdict is Verdict.FOREIGN_CURSOR
    assert observer.verdicts["foreign_cursor"] == 1
    # B was torn down atomically; A is untouched.
    assert await store.buffer.session_info("B") is None
    assert await store.buffer.session_info("A") is not None


def test_the_shared_store_is_no_event_store_only_its_session_views_are() -> None:
    """The SDK hands one event store to every session and names their streams alike: the
    object an application creates does not claim to be one (it could only mix sessions);
    each session's view is the SDK ``EventStore`` of that session."""
    store, _ = make_store()
    assert not isinstance(store, EventStore)
    assert not hasattr(store, "store_event")
    assert isinstance(store.for_session("A"), EventStore)


async def follow(view: SessionView, tail: Tail, count: int) -> list[str]:
    """What a live connection reads: catch-ups from the store after each wake-up."""
    got: list[str] = []
    with anyio.fail_after(10):  # a lost event would wait forever
        while len(got) < count:
            await tail.wait(0.05)
            caught = await view.live.catch_up(tail)
            assert caught.ok
            for event in caught.events:
                tail.advance(event.event_id)
                if event.payload is not None:
                    got.append(event.event_id)
    return got


async def test_resume_snapshot_and_live_tail_are_exact_under_concurrency() -> None:
    """Appends racing a resume land exactly once: in the replay or in the tail, never both."""
    store, _ = make_store(max_events=10_000)
    view = store.for_session("s")
    first = await view.store_event("1", None)
    produced: list[str] = []

    async def producer() -> None:
        for i in range(300):
            produced.append(await view.store_event("1", note(i)))
            if i % 7 == 0:
                await anyio.lowlevel.checkpoint()

    got: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(producer)
        await anyio.lowlevel.checkpoint()
        attachment = await view.live.attach_resume(first, prime=False)
        assert attachment.ok and attachment.tail is not None
        got.extend(e.event_id for e in attachment.replay)
        got.extend(await follow(view, attachment.tail, 300 - len(got)))
    assert got == produced


async def test_newest_connection_takes_the_stream_over() -> None:
    store, _ = make_store()
    view = store.for_session("s")
    first = await view.store_event("1", None)
    old = await view.live.attach_resume(first, prime=True)
    new = await view.live.attach_resume(first, prime=True)
    assert old.tail is not None and new.tail is not None
    assert old.tail.closed and old.tail.scope.cancel_called
    assert not new.tail.closed
    # The store keeps one priming event where several follow each other: the
    # connection gets it directly, the live feed reads only what follows.
    assert (
        new.first is not None and Cursor.parse(new.first).position == Cursor.parse(first).position
    )
    event_id = await view.store_event("1", note(1))
    caught = await view.live.catch_up(new.tail)
    assert [e.event_id for e in caught.events] == [event_id]


async def test_a_finished_stream_is_not_kept_open() -> None:
    store, _ = make_store()
    view = store.for_session("s")
    first = await view.store_event("3", None)
    await view.store_event("3", note(1))
    last = await view.store_event("3", response(3))
    replayed = await view.live.attach_resume(first, prime=True)
    assert replayed.tail is None and len(replayed.replay) == 2
    after_end = await view.live.attach_resume(last, prime=True)
    assert after_end.ok and after_end.tail is None and after_end.replay == []


async def test_get_messages_stored_while_detached_are_replayed_once() -> None:
    store, _ = make_store()
    view = store.for_session("s")
    early = [await view.store_event(GET_STREAM, note(i)) for i in range(2)]
    attachment = await view.live.attach_get(prime=True)
    assert [e.event_id for e in attachment.replay] == early
    assert attachment.tail is not None
    for event in attachment.replay:
        view.live.delivered(attachment.tail, event.event_id)
    await view.live.detach(attachment.tail)
    # Nothing missed since: nothing replayed, a priming event, nothing to read.
    live = await view.live.attach_get(prime=True)
    assert live.replay == [] and live.tail is not None and live.first is not None
    assert not (await view.live.catch_up(live.tail)).events
    view.live.delivered(live.tail, live.first)
    await view.live.detach(live.tail)
    later = await view.store_event(GET_STREAM, note(5))
    again = await view.live.attach_get(prime=False)
    assert [e.event_id for e in again.replay] == [later]


async def test_get_messages_evicted_while_detached_fail_closed() -> None:
    store, observer = make_store(max_events=5)
    view = store.for_session("s")
    for i in range(10):
        await view.store_event(GET_STREAM, note(i))
    attachment = await view.live.attach_get(prime=True)
    assert not attachment.ok
    assert attachment.resumption.verdict is Verdict.BELOW_FLOOR
    assert observer.verdicts == {"below_floor": 1}


async def test_a_tail_that_falls_behind_eviction_gets_a_verdict_not_a_gap() -> None:
    store, _ = make_store(max_events=5)
    view = store.for_session("s")
    first = await view.store_event("1", None)
    attachment = await view.live.attach_resume(first, prime=False)
    assert attachment.tail is not None
    for i in range(10):  # the connection reads nothing while these evict its position
        await view.store_event("1", note(i))
    caught = await view.live.catch_up(attachment.tail)
    assert caught.verdict is Verdict.BELOW_FLOOR and not caught.events


async def test_ending_the_view_closes_the_store_session() -> None:
    store, _ = make_store()
    view = store.for_session("s")
    event_id = await view.store_event("1", note(1))
    await view.end_everywhere()
    await view.end_everywhere()  # idempotent
    gone = await store.buffer.resolve("s", event_id)
    assert gone.verdict is Verdict.UNKNOWN_SESSION
    assert gone.evidence.tombstone is not None and gone.evidence.tombstone.verdict is None
    assert await view.store_event("1", note(2)) == ""  # a tool still running stores nothing


async def test_an_oversized_response_becomes_an_error_for_its_request() -> None:
    store, _ = make_store()
    view = store.for_session("s")
    first = await view.store_event("4", None)
    limit = store.buffer.retention.max_payload
    huge = JSONRPCResponse(jsonrpc="2.0", id=4, result={"text": "x" * (limit + 10)})
    await view.store_event("4", huge)
    replayed = await view.live.attach_resume(first, prime=False)
    assert replayed.ok and replayed.tail is None  # the stream ended with an answer
    ((answer),) = replayed.replay
    assert answer.payload is not None
    message = json.loads(answer.payload)
    assert message["id"] == 4
    assert "size limit" in message["error"]["message"]
    assert not view.closed  # the session is kept


def test_long_request_ids_map_to_bounded_names_deterministically() -> None:
    long_id = "x" * 5000
    name = sequence_name(long_id)
    assert name == sequence_name(long_id) and name.startswith("#")
    assert len(name.encode()) <= 256
    assert sequence_name("7") == "7" and sequence_name(GET_STREAM) == GET_STREAM
    assert sequence_name("#7") != "#7"  # never collides with a digest name
    assert sequence_name("a\x00b").startswith("#")


def test_prometheus_observer_counts_verdicts_and_latency() -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    observer.on_resumption("s", "resumed", 0.002, 4)
    observer.on_resumption("s", "below_floor", 0.001, 0)
    observer.on_resumption("s", "storage_error", 0.5, 0)

    def value(name: str, **labels: str) -> float:
        sample = registry.get_sample_value(name, labels)
        return 0.0 if sample is None else sample

    assert value("replaystore_mcp_resumptions_total", verdict="resumed") == 1
    assert value("replaystore_mcp_resumptions_total", verdict="below_floor") == 1
    assert value("replaystore_mcp_replay_seconds_count", outcome="failed") == 1
    assert value("replaystore_mcp_replay_seconds_count", outcome="storage_error") == 1
    assert value("replaystore_mcp_replayed_events_total") == 4


async def test_a_failed_verdict_is_logged_once_with_its_evidence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, _ = make_store()
    view = store.for_session("s")
    await view.store_event("1", note(1))
    with caplog.at_level("WARNING", logger="replaystore.mcp"):
        attachment = await view.live.attach_resume("000000000000-1", prime=True)
    assert attachment.resumption.verdict is Verdict.FOREIGN_CURSOR
    records = [r for r in caplog.records if r.name == "replaystore.mcp"]
    assert len(records) == 1
    assert records[0].levelname == "WARNING"
    assert "foreign_cursor" in records[0].getMessage()
    assert '"cursor_epoch": "000000000000"' in records[0].getMessage()

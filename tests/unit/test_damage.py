"""``lose_event`` damages exactly one event, and says so when it cannot."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest

from replaystore import ReplayBuffer, Verdict
from replaystore.testing import lose_event

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("url", ["memory://", "fakeredis"])
async def test_one_event_lost_the_others_kept(url: str) -> None:
    options: dict[str, Any] = {}
    if url == "fakeredis":
        url, options = "redis://", {"client": fakeredis.FakeAsyncRedis(), "prefix": "d:"}
    async with ReplayBuffer.from_url(url, teardown_on_failure=False, **options) as buf:
        await buf.open_session("s")
        ids = await buf.append_many("s", "a", [b"1", b"2", b"3"])
        await lose_event(buf, "s", 2)
        after_lost = await buf.resolve_and_replay("s", ids[1])
        assert after_lost.verdict is Verdict.NOT_RETAINED
        intact = await buf.resolve_and_replay("s", ids[2])
        assert intact.verdict is Verdict.RESUMED
        with pytest.raises(LookupError, match="no event at position 9"):
            await lose_event(buf, "s", 9)
        with pytest.raises(LookupError, match="'other'"):
            await lose_event(buf, "other", 1)


async def test_another_backend_is_refused_by_name() -> None:
    class Elsewhere:  # a third-party backend: its storage is its own
        pass

    buf: Any = SimpleNamespace(backend=Elsewhere())
    with pytest.raises(TypeError, match="Elsewhere"):
        await lose_event(buf, "s", 1)

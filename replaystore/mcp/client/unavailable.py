"""Client side: a request answered ``503`` with ``Retry-After`` is sent again, after that wait.

A replaystore server answers a request it cannot serve because its store did
not answer in time (or refused, or the replica is shutting down or just let
the session go) with HTTP 503, ``Retry-After`` and a JSON-RPC error whose
``data.reason`` says why (``storage_error``, ``draining``,
``session_dropped``). The SDK's client (and FastMCP's) fails the call with a
generic error instead of asking again. :class:`RetryUnavailable` is an
``httpx2`` transport that asks again, within a :class:`RetryBudget`.

Why sending the same request again is safe with a replaystore server:

- a POST answered 503 never ran: the 503 comes before the request's lease
  is taken, or the lease is given back with it (the request's first event
  refused, the store failing between the two). A store that stalled rather
  than failed may take the writes the replica sent before its 503 (the
  lease, the request's first event) later: a copy sent again then finds the
  request received before, never run, and is answered ``request lost`` (an
  error the call ends with, never a run);
- a copy of a request already received (same session, same JSON-RPC id,
  which a client never reuses) is never run again: it gets that request's
  stream from its start, with its one response;
- a GET (a resumption, the standalone stream) answered 503 keeps the
  session, and the same ``Last-Event-ID`` resumes it exactly.

Only a 503 that carries ``Retry-After`` in seconds is sent again: that is the
answer of a replaystore replica and of the balancer configurations of
``docs/deployment.md`` when no replica can take the request. A 503 without
it (a proxy's own error page, possibly after a server took the request) is
passed on: nothing says the request was not run. A request whose body was
streamed (not held in memory) cannot be sent again and is passed on too.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import anyio
import httpx2

from .answers import retry_after

__all__ = ["DEFAULT_BUDGET", "RetryBudget", "RetryUnavailable"]

logger = logging.getLogger("replaystore.mcp.client")


@dataclass(frozen=True)
class RetryBudget:
    """How long one request is asked again through 503s.

    ``tries``: sends of one request in all, the first included. ``within``:
    seconds from the first send after which no new wait starts (a wait that
    would end past it is not begun: the last 503 is passed on).
    ``longest_wait``: a ``Retry-After`` above it is waited this long. Each
    wait is lengthened by up to ``jitter`` (a fraction), so that clients
    told alike do not all come back in the same instant.
    """

    tries: int = 8
    within: float = 30.0
    longest_wait: float = 5.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.tries < 1 or self.within < 0 or self.longest_wait < 0 or self.jitter < 0:
            raise ValueError(f"a retry budget needs tries >= 1 and no negative time: {self}")


#: The budget of ``ResumingSession`` and ``DesyncWatch.client_factory`` unless told otherwise.
DEFAULT_BUDGET = RetryBudget()


class RetryUnavailable(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport that sends a request answered 503 with ``Retry-After`` again.

    Wraps ``inner`` (by default a plain ``httpx2.AsyncHTTPTransport``). The
    wait is the ``Retry-After`` seconds, capped at the budget's
    ``longest_wait``, plus jitter; each retry is logged at ``INFO`` on the
    ``replaystore.mcp.client`` logger.
    """

    def __init__(
        self, inner: httpx2.AsyncBaseTransport | None = None, budget: RetryBudget | None = None
    ) -> None:
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()
        self.budget = budget if budget is not None else DEFAULT_BUDGET

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        started = time.monotonic()
        tries = 1
        while True:
            response = await self._inner.handle_async_request(request)
            wait = self._wait(request, response, tries, started)
            if wait is None:
                return response
            await response.aclose()
            last = request.headers.get("last-event-id")
            logger.info(
                "%s %s%s answered 503: sent again in %.2f s (try %d of %d)",
                request.method,
                request.url,
                f" resuming after {last}" if last is not None else "",
                wait,
                tries + 1,
                self.budget.tries,
            )
            await anyio.sleep(wait)
            tries += 1

    def _wait(
        self, request: httpx2.Request, response: httpx2.Response, tries: int, started: float
    ) -> float | None:
        """Seconds to wait before sending ``request`` again, or ``None`` to pass ``response`` on."""
        if response.status_code != 503 or tries >= self.budget.tries:
            return None
        asked = retry_after(response.headers.get("retry-after"))
        if asked is None or not _resendable(request):
            return None
        wait = min(asked, self.budget.longest_wait) * (1 + random.uniform(0, self.budget.jitter))
        if time.monotonic() - started + wait > self.budget.within:
            return None
        return wait

    async def aclose(self) -> None:
        await self._inner.aclose()


def _resendable(request: httpx2.Request) -> bool:
    """Whether the body of ``request`` is held in memory (the SDK's always is)."""
    try:
        request.content  # noqa: B018 - raises for a streamed body not read
    except httpx2.RequestNotRead:
        return False
    return True

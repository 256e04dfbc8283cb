"""Each ``requestState`` answered once, on whichever replica it reaches.

A multi-round call (2026-07-28) hands the client a sealed ``requestState``
with an ``InputRequiredResult``; the client sends it back with its answers
and the tool's next round runs. Sealing proves the token is the server's,
not that it is new: a balancer's or a client's retry of that request runs
the round again (a payment, a deletion, a message sent twice), on this
replica or any other, for the token's whole lifetime.

:class:`SingleUseBoundary` is the SDK's ``RequestStateBoundary`` that, once
a token has been verified and before the round runs, records the token's
digest in the store every replica shares (one set-if-absent step, kept
until the token expires). The first request carrying the token runs its
round; every later one, on any replica, is refused with
:data:`REQUEST_STATE_USED` and runs nothing. A store that does not answer
refuses the round too (``503``): never a round run without its mark.

What it does not cover: a round whose answer is lost after it ran (the
client retrying it gets the refusal, not the first answer again: it starts
the call over), and a first round (it carries no ``requestState``; its
retry is a new call).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.methods import INPUT_REQUIRED_METHODS

from ..backends.coordination import Coordination
from ..errors import StorageError
from .unavailable import store_unavailable

__all__ = ["REQUEST_STATE_USED", "SingleUseBoundary"]

#: The ``data.reason`` of the error a repeated round gets.
REQUEST_STATE_USED = "request_state_used"

#: Seconds a mark outlives its token: replicas' clocks may disagree by this much.
CLOCK_SKEW = 60.0


class SingleUseBoundary(RequestStateBoundary):
    """The SDK's boundary, with each verified ``requestState`` accepted once (module docstring).

    ``coordination``: the store's, where the digests are recorded;
    ``store_timeout``: how long recording one may take before the round is
    answered ``503`` instead.
    """

    def __init__(
        self,
        security: RequestStateSecurity,
        *,
        default_audience: str | None,
        coordination: Coordination,
        store_timeout: float,
    ) -> None:
        super().__init__(security, default_audience=default_audience)
        self.policy = security
        self._coordination = coordination
        self._store_timeout = store_timeout

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        carrier = ctx.method in INPUT_REQUIRED_METHODS
        token = (ctx.params or {}).get("requestState") if carrier else None
        if not isinstance(token, str):
            return await super().__call__(ctx, call_next)

        async def once(verified: ServerRequestContext[Any, Any]) -> HandlerResult:
            # Reached only once the SDK verified the token: a forged one records nothing.
            await self._first_use(token)
            return await call_next(verified)

        return await super().__call__(ctx, once)

    async def _first_use(self, token: str) -> None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        ttl = self._remaining(token)
        try:
            with anyio.fail_after(self._store_timeout):
                first = await self._coordination.first_use(digest, ttl)
        except TimeoutError:
            raise store_unavailable(
                StorageError(f"the store did not answer within {self._store_timeout:g} s")
            ) from None
        except StorageError as exc:
            raise store_unavailable(exc) from None
        if not first:
            raise MCPError(
                INVALID_PARAMS,
                "requestState already used: this round was sent before and is not run again; "
                "start the call over without requestState",
                {"reason": REQUEST_STATE_USED},
            )

    def _remaining(self, token: str) -> float:
        """How long the mark is kept: until the token expires (its ``exp``, which the SDK
        just checked), plus :data:`CLOCK_SKEW` for replicas whose clocks run behind this
        one's; the policy's whole ``ttl`` if the envelope cannot be read."""
        ttl = self.policy.ttl
        try:
            claims = json.loads(self.policy.codec.unseal(token))
            left = min(max(float(claims["exp"]) - time.time(), 0.0), ttl)
        except Exception:
            left = ttl
        return left + CLOCK_SKEW

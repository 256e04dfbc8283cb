"""Each ``requestState`` runs its round once, on whichever replica it reaches.

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
round, and its answer (up to :data:`KEPT_ANSWER` bytes, as sent: a
``requestState`` in it sealed) is kept beside the digest. Every later
request carrying the token, on any replica, runs nothing: it gets that
answer again, marked in its ``_meta`` (:data:`REPEATED`), or, while the
first still runs, when it ended with an error or its answer was too large
to keep, the error :data:`REQUEST_STATE_USED`. A store that does not answer
refuses the round too (``503``): never a round run without its mark.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.methods import INPUT_REQUIRED_METHODS
from pydantic import BaseModel

from ...backends.coordination import Coordination
from ...errors import StorageError
from ..unavailable import store_unavailable

__all__ = ["KEPT_ANSWER", "REPEATED", "REQUEST_STATE_USED", "SingleUseBoundary"]

logger = logging.getLogger(__name__)

#: The ``data.reason`` of the error a repeated round gets when no answer can be given again.
REQUEST_STATE_USED = "request_state_used"

#: The ``_meta`` key marking an answer given again to a repeated round (it did not run again).
REPEATED = "io.github.replaystore/repeated"

#: Largest answer kept for repeats, in bytes of JSON (a larger one: repeats get the error).
KEPT_ANSWER = 64 * 1024

#: Seconds a mark outlives its token: replicas' clocks may disagree by this much.
CLOCK_SKEW = 60.0

_T = TypeVar("_T")


class _Repeated(Exception):
    """The round of this token ran before (or runs): what it answered ("" for nothing kept)."""

    def __init__(self, answer: str) -> None:
        super().__init__("requestState already used")
        self.answer = answer


class SingleUseBoundary(RequestStateBoundary):
    """The SDK's boundary, with each verified ``requestState`` run once (module docstring).

    ``coordination``: the store's, where the digests and answers are kept;
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
        digest = hashlib.sha256(token.encode()).hexdigest()
        ttl = self._remaining(token)

        async def once(verified: ServerRequestContext[Any, Any]) -> HandlerResult:
            # Reached only once the SDK verified the token: a forged one records nothing.
            earlier = await self._store(self._coordination.first_use(digest, ttl))
            if earlier is not None:
                raise _Repeated(earlier)
            return await call_next(verified)

        try:
            result = await super().__call__(ctx, once)
        except _Repeated as repeated:
            return _again(repeated.answer)
        await self._keep(digest, result, ttl)
        return result

    async def _store(self, call: Awaitable[_T]) -> _T:
        """The store's answer to ``call``, or the round refused as the store not serving it."""
        try:
            with anyio.fail_after(self._store_timeout):
                return await call
        except TimeoutError:
            raise store_unavailable(
                StorageError(f"the store did not answer within {self._store_timeout:g} s")
            ) from None
        except StorageError as exc:
            raise store_unavailable(exc) from None

    async def _keep(self, digest: str, result: HandlerResult, ttl: float) -> None:
        """Keep the answer for repeats; one not kept only makes repeats get the error."""
        text = _text(result)
        if text is None or len(text) > KEPT_ANSWER:
            return
        try:
            with anyio.fail_after(self._store_timeout):
                await self._coordination.keep_answer(digest, text, ttl)
        except (TimeoutError, StorageError) as exc:
            logger.info("requestState: a round's answer was not kept for repeats: %s", exc)

    def _remaining(self, token: str) -> float:
        """How long the mark is kept: until the token expires (its ``exp``, which the SDK
        checks), plus :data:`CLOCK_SKEW` for replicas whose clocks run behind this one's;
        the policy's whole ``ttl`` if the envelope cannot be read (a forged token: the SDK
        refuses it before anything is recorded)."""
        ttl = self.policy.ttl
        try:
            claims = json.loads(self.policy.codec.unseal(token))
            left = min(max(float(claims["exp"]) - time.time(), 0.0), ttl)
        except Exception:
            left = ttl
        return left + CLOCK_SKEW


def _text(result: HandlerResult) -> str | None:
    """The answer as JSON (as the SDK sends it), or None when it cannot be kept."""
    try:
        if isinstance(result, BaseModel):
            return result.model_dump_json(by_alias=True, exclude_none=True)
        if isinstance(result, Mapping):
            return json.dumps(dict(result), separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return None


def _again(answer: str) -> dict[str, Any]:
    """The first answer given again, marked; the error when there is none to give."""
    if not answer:
        raise MCPError(
            INVALID_PARAMS,
            "requestState already used: this round was sent before and is not run again "
            "(it still runs, failed, or its answer was not kept); start the call over "
            "without requestState",
            {"reason": REQUEST_STATE_USED},
        )
    given: dict[str, Any] = json.loads(answer)
    meta = given.get("_meta")
    given["_meta"] = {**(meta if isinstance(meta, dict) else {}), REPEATED: True}
    return given

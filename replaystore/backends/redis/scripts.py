"""The script library: the Lua operations, and the one place that picks how a server runs them.

Every operation is one Lua file in ``replaystore/backends/redis/lua/`` behind the
shared helpers of ``_lib.lua``. A server that takes functions (Redis 7+,
Valkey) runs them as one function library, loaded on first use: the helpers
are defined once, not on every call as in a script. Elsewhere (a cluster,
fakes, a read-only replica, an ACL that refuses functions) they run as
scripts: ``EVALSHA``, re-sent with ``EVAL`` when the script cache lost them.
:meth:`Library.call` is that choice, for every operation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from ...retention import EVICTED_SEQUENCES
from ...verdicts import REASONS

__all__ = [
    "CLOCK_MARGIN_MS",
    "FACT_SLOTS",
    "FUNCTIONS",
    "LIBRARY",
    "LIBRARY_ID",
    "SCRIPTS",
    "SLOT",
    "Library",
]

#: How far this process's clock may be behind the server's before the resume
#: fast path could miss a TTL refresh or an age eviction that is due (hosts
#: kept in step by NTP are within milliseconds): within this of either moment
#: the script decides, and ``facts.lua`` refreshes this much early.
CLOCK_MARGIN_MS = 2_000

#: The slots of ``facts.lua``'s reply, in order. The script reads them from a
#: generated ``SLOT`` table, so this tuple is the one place that names them.
FACT_SLOTS = (
    "status",
    "tombstone",
    "need_tag",
    "epoch",
    "top",
    "floor",
    "count",
    "nseq",
    "named_state",
    "record_tag",
    "record_ordinal",
    "record_element",
    "chain_tag",
    "chain_state",
    "chain_ordinal",
    "evicted_element",
    "touch",
    "sweep",
    "torn",
)
SLOT = {name: index for index, name in enumerate(FACT_SLOTS)}
#: The conditions ``facts.lua`` checks to tear down in the same call (the
#: common failed reconnects), and the reason code each means under the rules.
#: The script gets the tombstone of each as a generated constant: reading it
#: from an argument on every call cost more than the rest of a failed resume's
#: decision.
TEARDOWN_CONDITIONS = {
    "no_cursor": "malformed",
    "epoch_differs": "foreign",
    "past_top": "ahead",
    "below_floor_unproven": "evicted",
    "other_sequence": "mismatch",
}


def _torn_entry(condition: str, code: str) -> str:
    """``condition = {code, tombstone}``: the tombstone's JSON up to its time and nonce."""
    verdict = REASONS[code][0].value
    tomb = '{"code":"' + code + '","verdict":"' + verdict + '"'
    return f"{condition} = {{'{code}', '{tomb}'}}"


_PRELUDE = (
    "local SLOT = {"
    + ", ".join(f"{name} = {index + 1}" for index, name in enumerate(FACT_SLOTS))
    + f", _n = {len(FACT_SLOTS)}}}\n"
    + "local TORN = {"
    + ", ".join(_torn_entry(c, code) for c, code in TEARDOWN_CONDITIONS.items())
    + "}\n"
    + f"local EVICTED_SEQUENCES = {EVICTED_SEQUENCES}\n"
    + f"local CLOCK_MARGIN_MS = {CLOCK_MARGIN_MS}\n"
)

_OPERATIONS = (
    "open",
    "append",
    "append_lean",
    "facts",
    "info",
    "close",
    "sweep",
    "touch",
    "drop",
    "fail",
)
#: Operations that read ``keys`` and ``argv`` themselves instead of through
#: the helpers' setup (the lists' count and tags first): for the leanest call.
_DIRECT = frozenset({"append_lean"})


def _lua(name: str) -> str:
    return (resources.files(__package__) / "lua" / name).read_text()


_LIB = _PRELUDE + _lua("_lib.lua") + "\n"
_BODIES = {
    name: f"local function op_{name}({'keys, argv' if name in _DIRECT else ''})\n"
    f"{_lua(f'{name}.lua')}\nend\n"
    for name in _OPERATIONS
}


def _entry(name: str, keys: str, argv: str) -> str:
    """The call of operation ``name`` on ``keys`` and ``argv`` (names of Lua values)."""
    if name in _DIRECT:
        return f"op_{name}({keys}, {argv})"
    return f"run(op_{name}, {keys}, {argv})"


@dataclass(frozen=True, slots=True)
class _Script:
    """One operation as an EVAL script: the slot table, the helpers, the operation, a call."""

    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> _Script:
        source = _LIB + _BODIES[name] + f"return {_entry(name, 'KEYS', 'ARGV')}\n"
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


SCRIPTS = {name: _Script.load(name) for name in _OPERATIONS}

#: The same operations as one function library. The name carries a hash of
#: the code, so a server never runs another version's.
LIBRARY_ID = hashlib.sha1("".join(s.source for s in SCRIPTS.values()).encode()).hexdigest()[:12]
FUNCTIONS = {name: f"replaystore_{LIBRARY_ID}_{name}" for name in _OPERATIONS}
LIBRARY = (
    f"#!lua name=replaystore_{LIBRARY_ID}\n"
    + _LIB
    + "".join(_BODIES.values())
    + "".join(
        f"redis.register_function('{FUNCTIONS[name]}', "
        f"function(keys, argv) return {_entry(name, 'keys', 'argv')} end)\n"
        for name in _OPERATIONS
    )
)

#: Sends one command and returns its reply; an error reply is raised.
Send = Callable[[tuple[Any, ...]], Awaitable[Any]]
#: An operation's keys and arguments, built only when a form needs them.
Operands = Callable[[], tuple[Sequence[str], Sequence[Any]]]


def fcall_of(name: str, operands: Operands) -> tuple[Any, ...]:
    """The ``FCALL`` of operation ``name`` on its operands."""
    keys, args = operands()
    return ("FCALL", FUNCTIONS[name], len(keys), *keys, *args)


def _refused(exc: ResponseError) -> str:
    """Why a server refused an ``FCALL`` before running anything, or ``""`` if it did not."""
    text = str(exc).lower()
    if "read only replica" in text:
        return "replica"  # a function may write, so a replica refuses any
    if isinstance(exc, NoPermissionError) or "unknown command" in text:
        return "no functions"  # an ACL that allows scripts but not functions, or an old server
    if "function not found" in text:
        return "not loaded"  # never loaded, or lost with a restart without persistence
    return ""


class Library:
    """The operations as one server takes them: functions while it does, scripts otherwise.

    ``command`` sends a command on its own (the library is loaded with it);
    ``functions`` is whether to try functions first, given the client (a
    cluster client or a fake gets scripts from the start).
    """

    def __init__(self, command: Send, *, functions: bool) -> None:
        self._command = command
        self.functions = functions

    async def call(
        self,
        name: str,
        operands: Operands,
        send: Send | None = None,
        *,
        packed: Callable[[], Awaitable[Any]] | None = None,
    ) -> Any:
        """Run operation ``name``: ``FCALL``, else ``EVALSHA``, else ``EVAL``.

        ``send`` sends each form (by default alone; an append that waits for
        replicas pipelines a ``WAIT`` behind it). ``packed``, when given, sends
        the ``FCALL`` already packed, so that the operands are built only if a
        server refuses it. A server that has no such function gets the library
        loaded and the call once more; one that refuses functions (or is a
        read-only replica, where a read that writes nothing still runs as a
        script) gets the scripts, from now on unless it is a replica.
        """
        send = send or self._command
        if self.functions:
            fcall: tuple[Any, ...] = ()
            try:
                if packed is not None:
                    return await packed()
                fcall = fcall_of(name, operands)
                return await send(fcall)
            except ResponseError as exc:
                refusal = _refused(exc)
                if not refusal:
                    raise
            if refusal == "no functions":
                self.functions = False
            elif refusal == "not loaded":
                try:
                    await self._command(("FUNCTION", "LOAD", "REPLACE", LIBRARY))
                except ResponseError:
                    self.functions = False  # no permission, no functions: scripts from now on
                else:
                    if not fcall:
                        fcall = fcall_of(name, operands)
                    try:
                        return await send(fcall)
                    except ResponseError as exc:
                        if _refused(exc) != "not loaded":
                            raise
                        # flushed again in between: this call runs as a script
        script = SCRIPTS[name]
        keys, args = operands()
        try:
            return await send(("EVALSHA", script.sha, len(keys), *keys, *args))
        except NoScriptError:
            # The script cache is volatile; EVAL runs and re-caches it.
            return await send(("EVAL", script.source, len(keys), *keys, *args))

"""What an app built by the wiring sets for the whole process it runs in.

Two settings belong to the process, not to one app: the garbage collector's
thresholds and the length of log records. The wiring applies both when the
app starts (``collector_threshold``, ``log_record_limit``); a server of your
own may call them itself.

**The collector**, set for a server that holds many sessions. A replica
holds every session it serves as long-lived objects (the SDK's
session loop, its streams and tasks: a few hundred objects per session), and
every request allocates and frees thousands of short-lived ones. With
CPython's default thresholds (a young collection every 700 net allocations)
the young collections run so often that objects merely in flight (a request
being answered) are promoted again and again, and the old generation fills
until a full collection walks every session's objects: with 1,200 sessions
held, measured at several milliseconds of replica CPU per resume, most of a
resume's cost in a reconnect storm.

:func:`tune_collector` does what CPython's documentation suggests for such a
process: one collection, then :func:`gc.freeze` moves everything alive after
start-up (modules, the app, pools) out of the collector's sight for good, and
a young-generation threshold high enough that a collection finds few objects
still in flight. Reference counting frees the short-lived objects as before;
only garbage in reference cycles waits longer (at most ``threshold`` net
allocations) to be freed.

**Log records** of bounded length, whatever a peer put in them. Records
quote what clients send: a tool name, a request id, a cursor,
the body of a request that failed to parse. The SDK, uvicorn and this
package echo those into their records, so a client sending a 2 MB tool name
would otherwise write megabytes of log per request. :func:`capping_records`
cuts every record the process's log handlers write to ``limit`` characters
(its message, and its traceback), saying how long it was.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .settings import DEFAULT_DRAIN_SECONDS

__all__ = [
    "COLLECTOR_THRESHOLD",
    "LOG_RECORD_LIMIT",
    "CappedRecords",
    "Process",
    "capped",
    "capping_records",
    "tune_collector",
    "tune_collector_once",
]

#: Net allocations between two young collections (CPython's default: 700).
COLLECTOR_THRESHOLD = 50_000


def tune_collector(threshold: int = COLLECTOR_THRESHOLD) -> None:
    """Set the collector for a long-running server; call it once its start-up is done.

    The example server calls it when uvicorn has started the app (after its
    lifespan ran); a server of your own calls it at the same point, e.g. at
    the end of its lifespan's start-up.
    """
    if threshold < 1:
        raise ValueError(f"threshold must be at least 1, not {threshold}")
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)


#: Longest message (and longest traceback) of a log record, in characters.
LOG_RECORD_LIMIT = 2000


def capped(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


class CappedRecords(logging.Filter):
    """A handler filter that cuts a record's message and traceback to ``limit`` characters."""

    def __init__(self, limit: int = LOG_RECORD_LIMIT) -> None:
        super().__init__()
        self.limit = limit

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > self.limit:
            record.msg, record.args = capped(message, self.limit), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and len(record.exc_text) > self.limit:
            record.exc_text = capped(record.exc_text, self.limit)
        return True


def _handlers() -> list[logging.Handler]:
    """Every handler of the process's loggers (uvicorn's own included), and the last resort."""
    loggers = [logging.getLogger()]
    loggers += [
        logger
        for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    found = [handler for logger in loggers for handler in logger.handlers]
    if logging.lastResort is not None:
        found.append(logging.lastResort)
    return list(dict.fromkeys(found))


@contextmanager
def capping_records(limit: int | None = LOG_RECORD_LIMIT) -> Iterator[None]:
    """While open, the handlers configured now write no record longer than ``limit``.

    ``None`` leaves the log alone. A handler already capping is left as it is.
    """
    if limit is None:
        yield
        return
    if limit < 1:
        raise ValueError(f"log record limit must be at least 1, not {limit}")
    added: list[tuple[logging.Handler, CappedRecords]] = []
    for handler in _handlers():
        if not any(isinstance(f, CappedRecords) for f in handler.filters):
            cap = CappedRecords(limit)
            handler.addFilter(cap)
            added.append((handler, cap))
    try:
        yield
    finally:
        for handler, cap in added:
            handler.removeFilter(cap)


@dataclass(frozen=True)
class Process:
    """What an app does to the process it runs in (the wiring's keyword arguments of that name).

    ``drain_seconds``: on the server's stop (``SIGTERM``, Ctrl-C), how long
    running requests and tasks may finish while no new work is taken
    (:mod:`~replaystore.mcp.stopping`). ``collector_threshold``: the
    garbage collector tuned once the app started
    (:func:`~replaystore.mcp.tune_collector`; None leaves it alone).
    ``log_record_limit``: the longest log record written while the app runs,
    in characters (:mod:`~replaystore.mcp.process`; None leaves the log alone).
    ``check_store``: check what the store must give a replica once, in the
    background, at start (:meth:`~replaystore.mcp.ReplaySessionManager.check_store`).
    """

    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    collector_threshold: int | None = COLLECTOR_THRESHOLD
    log_record_limit: int | None = LOG_RECORD_LIMIT
    check_store: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.drain_seconds <= 3600:
            raise ValueError(f"drain_seconds must be 0 to 3600, not {self.drain_seconds}")
        if self.collector_threshold is not None and self.collector_threshold < 1:
            raise ValueError("collector_threshold must be at least 1 or None")
        if self.log_record_limit is not None and self.log_record_limit < 1:
            raise ValueError("log_record_limit must be at least 1 or None")


#: The collector is tuned once per process, by the first app that starts.
_collector_tuned = False


def tune_collector_once(threshold: int | None) -> None:
    """:func:`tune_collector` with ``threshold``, by the first app of the process that starts."""
    global _collector_tuned
    if threshold is not None and not _collector_tuned:
        _collector_tuned = True
        tune_collector(threshold)

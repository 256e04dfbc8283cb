"""Log records of bounded length, whatever a peer put in them.

Log records quote what clients send: a tool name, a request id, a cursor,
the body of a request that failed to parse. The SDK, uvicorn and this
package echo those into their records, so a client sending a 2 MB tool name
would otherwise write megabytes of log per request. :func:`capping_records`
cuts every record the process's log handlers write to ``limit`` characters
(its message, and its traceback), saying how long it was.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LOG_RECORD_LIMIT", "CappedRecords", "capped", "capping_records"]

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

"""Python's cyclic garbage collector, set for a server that holds many sessions.

A replica holds every session it serves as long-lived objects (the SDK's
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
"""

from __future__ import annotations

import gc

__all__ = ["COLLECTOR_THRESHOLD", "tune_collector"]

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

"""A replica that stops on purpose hands its tasks over instead of failing them.

On ``SIGTERM`` (a rolling restart, a scale-down) a replica stops taking new
tasks and lets the running ones go on for its drain period; most finish.
What still runs then is handed over at once rather than left to a lapsing
lease:

- a task of an idempotent tool has its lease released (a renewal with a
  lease of 0): the next replica that looks at it, a client's ``tasks/get`` or
  a scan, claims it and runs it again, with no lease to wait out;
- any other task ends ``failed`` with an error and a ``statusMessage`` saying
  the server shut down before it finished: nothing can resume it, and saying
  so now beats a client waiting for a lease to lapse.

Either way the tool is stopped here, and its own end is not stored.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from ...errors import StorageError
from ...taskstore import FAILED, TaskStore
from ..metrics import count_drain
from .leases import Run

__all__ = ["SHUTDOWN_ERROR", "drain_runs", "draining", "hand_over"]

logger = logging.getLogger("replaystore.mcp.tasks")

#: The error of a task that cannot be run again, left unfinished by a replica that shut down.
SHUTDOWN_ERROR: dict[str, Any] = {
    "code": INTERNAL_ERROR,
    "message": "the server running this task shut down before it finished",
}


def draining() -> MCPError:
    """The error of a task call reaching a replica that shuts down: answered ``503``.

    The same ``data`` as a store that did not serve the request, so the
    answer goes out as ``503`` with ``Retry-After`` (see
    :mod:`~replaystore.mcp.unavailable`) and a balancer or ``TaskClient``
    sends it again, to another replica; no task was created.
    """
    return MCPError(
        INTERNAL_ERROR,
        "Service Unavailable: this replica is shutting down; send the request again",
        {"verdict": None, "reason": "storage_error", "draining": True},
    )


async def drain_runs(runs: Mapping[str, Run], seconds: float) -> None:
    """Wait up to ``seconds`` for ``runs`` to end by themselves (polled: they end in any order)."""
    with anyio.move_on_after(seconds):
        for _ in itertools.count():
            if all(run.done for run in runs.values()):
                return
            await anyio.sleep(0.05)
    count_drain("handed_over")  # some still run: the caller hands them over


async def hand_over(
    store: TaskStore, runs: Mapping[str, Run], runner: str, within: float = 5.0
) -> None:
    """Release the re-runnable tasks still running here, fail the others; stop their tools.

    All at once, within ``within`` seconds: a store that does not answer
    must not hold the shutdown (a task not handed over has its lease lapse).
    """
    left = [run for run in list(runs.values()) if not run.done]
    for run in left:
        run.ended = True  # its end is decided here: the tool's own is not stored
        run.scope.cancel()
    with anyio.move_on_after(within):
        async with anyio.create_task_group() as group:
            for run in left:
                group.start_soon(_hand_over_one, store, run, runner)


async def _hand_over_one(store: TaskStore, run: Run, runner: str) -> None:
    try:
        if run.rerunnable:
            await store.beat(run.task_id, runner, 0.0)
            logger.info("task %s: handed over to another replica (shutting down)", run.task_id)
        else:
            await store.finish(
                run.task_id,
                FAILED,
                error=SHUTDOWN_ERROR,
                message=str(SHUTDOWN_ERROR["message"]),
                runner=runner,
            )
    except StorageError as exc:  # its lease lapses instead
        logger.warning("task %s: could not be handed over: %s", run.task_id, exc)

"""Which tool calls run as tasks, and how: a :class:`TaskSupport` per tool, for ``ReplayTasks``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Mode", "TaskSupport"]

Mode = Literal["forbidden", "optional", "required"]


@dataclass(frozen=True, slots=True)
class TaskSupport:
    """Whether a tool runs as a task, and for how long its task is kept.

    ``forbidden``: never (the tool answers as a plain call); ``optional``: as a
    task for a client that declares the extension, plainly otherwise;
    ``required``: only as a task (a client without the extension gets -32021).
    ``ttl`` (seconds) overrides the default for this tool's tasks.

    ``idempotent``: running the tool again with the same arguments is safe, so
    when the replica running its task dies, a survivor runs it again from the
    start (with ``attempts`` runs in all, the first one included) instead of
    failing the task as lost. The call's arguments are stored with the task.
    """

    mode: Mode = "optional"
    ttl: float | None = None
    idempotent: bool = False
    attempts: int = 3

    def __post_init__(self) -> None:
        if self.mode not in ("forbidden", "optional", "required"):
            raise ValueError(f"task support must be forbidden, optional or required: {self.mode!r}")
        if self.ttl is not None and not 0 < self.ttl <= 366 * 86400:
            raise ValueError("a task TTL is between 0 and 366 days (seconds)")
        if not 1 <= self.attempts <= 100:
            raise ValueError("attempts is between 1 and 100")

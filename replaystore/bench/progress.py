"""A progress bar on stderr while the storm runs (rich), so stdout keeps only the table."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

__all__ = ["Bar"]


class Bar:
    """One line per phase; silent when disabled, when stderr is not a terminal, or without rich."""

    def __init__(self, *, enabled: bool) -> None:
        self._progress: Any = None
        if enabled:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )
            except ImportError:  # the bench extra brings rich; without it, no bar
                return
            console = Console(stderr=True)
            if console.is_terminal:
                self._progress = Progress(
                    TextColumn("{task.description:<24}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=console,
                )

    def __enter__(self) -> Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextmanager
    def task(self, label: str, total: int) -> Iterator[Callable[[int], None]]:
        if self._progress is None:
            yield lambda n: None
            return
        task_id = self._progress.add_task(label, total=total)

        def advance(n: int) -> None:
            self._progress.advance(task_id, n)

        yield advance
        self._progress.update(task_id, completed=total)

"""A store outage as the log tells it: a few lines per outage, not one per failed call.

Every session of a replica stores events, every replica renews its leases
and reads the store's notifications; when the store stops serving (down, out
of memory, an append no replica acknowledges), each of those fails at once
and again at every retry. A line per failure floods the log for as long as
the outage lasts and hides its start. :class:`OutageLog` says when failures
begin, at most one line per ``every`` seconds while they go on (how many,
the last error), and when a call succeeds again. It is the one rate limit of
the package's outage lines: every loop that retries a store call logs
through one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["REPORT_EVERY", "OutageLog"]

#: Seconds between two lines about one ongoing outage.
REPORT_EVERY = 30.0


class OutageLog:
    """The lines of one kind of failing call (``what``), for one process."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        every: float = REPORT_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self.what = what
        self.every = every
        self._clock = clock
        self._since: float | None = None  # when the reported outage began
        self._last_line = -float("inf")
        self._failures = 0  # since the reported outage began
        self._unreported = 0  # failures since the last line
        self._down = False  # the latest call failed

    @property
    def failing(self) -> bool:
        """Whether the latest call failed (reported or not)."""
        return self._down

    @property
    def reported(self) -> bool:
        """Whether the log said an outage began and has not said it ended."""
        return self._since is not None

    def failed(self, trouble: str) -> None:
        """One call failed; ``trouble`` says why in the store's words."""
        now = self._clock()
        self._down = True
        self._failures += 1
        self._unreported += 1
        if now - self._last_line < self.every:
            return
        if self._since is None:
            self._since, self._failures = now, self._unreported
            self._logger.warning(
                "%s failed: %s (logged again every %g s while it fails)",
                self.what,
                trouble,
                self.every,
            )
        else:
            self._logger.warning(
                "%s still failing: %d failure(s) in the last %.0f s; last: %s",
                self.what,
                self._unreported,
                now - self._last_line,
                trouble,
            )
        self._last_line, self._unreported = now, 0

    def succeeded(self, note: str = "") -> None:
        """One call succeeded: the end of the reported outage, if one is open.

        ``note`` ends that line (what the store came back with, say).
        """
        self._down = False
        if self._since is None:
            self._unreported = 0  # failures nobody was told of: over too
            return
        now = self._clock()
        self._logger.warning(
            "%s works again after %.1f s and %d failure(s)%s",
            self.what,
            now - self._since,
            self._failures,
            f"; {note}" if note else "",
        )
        # A failure right after this line waits for the next one: a flapping
        # store gives a line per ``every`` seconds, not one per flap.
        self._since, self._last_line, self._failures, self._unreported = None, now, 0, 0

"""``replaystore bench``: benchmarks a user can run against the stores people use.

``replaystore bench storm`` drives thousands of sessions through a reconnect
storm from several replica processes on one backend and judges every reconnect
against ground truth; ``replaystore bench task-streams`` does the same for
task event streams (``tasks/stream``), beside a listener without replay.
Needs the ``bench`` extra (``pip install 'replaystore[bench]'``); see
``docs/benchmarks.md``.
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]

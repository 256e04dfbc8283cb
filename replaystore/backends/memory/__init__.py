"""``memory://``: the embedded backend, and how replicas of one process coordinate through it.

:mod:`.backend` holds the five operations; :mod:`.coordination` the
:class:`InProcess` coordination the backend declares, which builds the
registry, bus, task store and listen events kept in this process beside it.
"""

from __future__ import annotations

from .backend import MemoryBackend
from .coordination import InProcess

__all__ = ["InProcess", "MemoryBackend"]

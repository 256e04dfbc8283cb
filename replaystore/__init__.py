"""replaystore: SSE replay buffers that resume exactly, or say why they cannot.

A client that reconnects with ``Last-Event-ID`` gets exactly the events it
missed, or a distinct verdict (``below_floor``, ``foreign_cursor`` …) and a
torn-down session: never a silent success with a gap or a duplicate in it.
"""

from .backends import Backend, register_backend
from .buffer import ReplayBuffer
from .cursor import Cursor, CursorError
from .errors import (
    IdempotencyKeyReusedError,
    InvalidInputError,
    ReplayStoreError,
    SequenceTagCollisionError,
    StorageError,
    StoreRegressedError,
    UnknownSessionError,
    UnsupportedURLError,
)
from .info import SequenceInfo, SessionInfo
from .retention import Retention
from .verdicts import (
    Event,
    Evidence,
    Replay,
    Resumption,
    ResumptionDesyncError,
    Tombstone,
    Verdict,
)

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "Cursor",
    "CursorError",
    "Event",
    "Evidence",
    "IdempotencyKeyReusedError",
    "InvalidInputError",
    "Replay",
    "ReplayBuffer",
    "ReplayStoreError",
    "Resumption",
    "ResumptionDesyncError",
    "Retention",
    "SequenceInfo",
    "SequenceTagCollisionError",
    "SessionInfo",
    "StorageError",
    "StoreRegressedError",
    "Tombstone",
    "UnknownSessionError",
    "UnsupportedURLError",
    "Verdict",
    "__version__",
    "register_backend",
]

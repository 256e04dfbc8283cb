"""Fixtures for the Redis-specific tests: real servers only, never the machine's 6379.

The servers come from ``tests/plugins/servers.py``: ``redis_server``,
``valkey_server`` and ``cluster_server`` are shared with the whole test
session (isolate with ``prefix``); ``scratch_server``, ``scratch_valkey``
and ``own_server`` belong to one module or one test.
"""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # redis.asyncio is asyncio-only.
    return "asyncio"


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"rt{uuid.uuid4().hex[:10]}:"

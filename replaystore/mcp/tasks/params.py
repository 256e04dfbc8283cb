"""The params of the ``tasks/*`` requests, as the server reads them."""

from __future__ import annotations

from typing import Any

from mcp_types import RequestParams
from pydantic import Field

__all__ = ["StreamParams", "TaskIdParams", "UpdateParams"]


class TaskIdParams(RequestParams):
    """``tasks/get`` and ``tasks/cancel`` params."""

    task_id: str = Field(max_length=256)


class UpdateParams(TaskIdParams):
    """``tasks/update`` params."""

    input_responses: dict[str, dict[str, Any]]


class StreamParams(TaskIdParams):
    """``tasks/stream`` params: ``after`` is judged as sent (``sep2694.judge_cursor``)."""

    after: Any = None

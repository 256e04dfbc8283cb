"""The one ``async with`` shape of the client's objects: entered as they are, closed on exit."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing:
    """``async with obj:`` returns ``obj`` and ends with ``await obj.aclose()``.

    For objects that are ready when built (nothing to open on entry), so an
    application may use them with or without ``async with`` and close them
    either way.
    """

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release what the object holds."""

"""FastMCP 4: resumable apps and durable tasks through FastMCP's own seams.

:func:`fastmcp_http_app` (also exported by :mod:`replaystore.mcp`) builds the
app. :class:`FastMCPTasks`, :class:`TaskContexts` (they need the tasks
stack, which an app without tasks never imports) and
:class:`ListenMiddleware` are loaded on first use: they need the ``fastmcp``
package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .app import fastmcp_http_app

if TYPE_CHECKING:
    from .listen import ListenMiddleware
    from .tasks import FastMCPTasks, TaskContexts

__all__ = ["FastMCPTasks", "ListenMiddleware", "TaskContexts", "fastmcp_http_app"]

_LAZY = frozenset({"FastMCPTasks", "TaskContexts"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import tasks

        return getattr(tasks, name)
    if name == "ListenMiddleware":
        from .listen import ListenMiddleware

        return ListenMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

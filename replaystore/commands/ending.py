"""How every ``replaystore`` command ends: a status and at most one line on stderr.

Shared by ``replaystore`` (:mod:`replaystore.commands.cli`) and the example MCP server
(``replaystore example-server``, also ``python -m replaystore.mcp.example``),
so that both command lines fail the same way whichever one a user typed. It
imports nothing but the exceptions, so either can import it at start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..errors import ReplayStoreError

__all__ = ["one_line", "run_command"]

#: Longest error line printed, in characters: a driver's error may quote a whole reply.
MAX_ERROR = 300


def one_line(text: str, limit: int = MAX_ERROR) -> str:
    """An error as one line a person reads: no newlines, and the gist of a driver's repr."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def run_command(command: Callable[[], int]) -> int:
    """Run ``command``; what replaystore raises on purpose becomes one line and status 2.

    A reader gone away (``replaystore demo | head``) ends quietly with the
    status of a command ended by SIGPIPE (141), Ctrl-C with 130. Anything
    else is a bug and keeps its traceback.
    """
    try:
        return command()
    except ReplayStoreError as exc:
        print(f"replaystore: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:
        return 130

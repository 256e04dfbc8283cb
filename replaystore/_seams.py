"""Checked seams: the names beyond a dependency's public API this package relies on.

Two dependencies offer no public way to do what this package needs: the MCP
SDK (:mod:`replaystore.mcp._sdk.checked`: storing sessions elsewhere, adopting one in
another process) and redis-py (:mod:`replaystore.backends.redis.redispy`:
sending commands by hand on its connections). Each lists every private name
it uses as a :class:`Requirement`, with why, and checks the list when it is
imported, so that an upgrade which renames one is caught at once, by name,
instead of misbehaving at run time. What a module does with a failed check
is its own: the SDK's refuses to import, redis-py's falls back to the public
API with a warning.

Imports nothing else of the package, so either side may use it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Owners", "Requirement", "describe", "missing"]


@dataclass(frozen=True, slots=True)
class Requirement:
    """One name beyond a dependency's public API: where it lives, what it is, and why.

    ``owner`` is a key of the checking module's table of owners (how to get the
    object to look the name up on); ``kind`` is ``"method"`` (or function),
    ``"attribute"`` (on an instance or a class) or ``"parameter"`` (of a
    callable). ``source`` is set for a method this package overrides: the
    digest of the upstream source it was written against (see
    :func:`replaystore.mcp._sdk.checked.changed_sources`).
    """

    owner: str
    name: str
    kind: str
    why: str
    source: str = ""


#: How to get the object a requirement's name is looked up on, per owner.
Owners = Mapping[str, Callable[[], Any]]


def _missing(
    requirement: Requirement, owners: Owners, optional: tuple[type[BaseException], ...]
) -> bool:
    try:
        target = owners[requirement.owner]()
    except optional:  # a package this part may run without, and does
        return False
    except Exception:  # an owner that cannot be built has none of its names
        return True
    if requirement.kind == "parameter":
        try:
            return requirement.name not in inspect.signature(target).parameters
        except (TypeError, ValueError):  # no signature to look in
            return True
    if requirement.kind == "method":
        return not callable(getattr(target, requirement.name, None))
    return not hasattr(target, requirement.name)


def missing(
    reqs: Iterable[Requirement],
    owners: Owners,
    *,
    optional: tuple[type[BaseException], ...] = (),
) -> list[Requirement]:
    """The requirements the installed packages do not meet, in order.

    ``optional``: the exceptions that building an owner raises when it belongs
    to a package that need not be installed (its names are then not missing:
    nothing will use them).
    """
    return [r for r in reqs if _missing(r, owners, optional)]


def describe(gone: Iterable[Requirement]) -> str:
    """``owner.name (kind: why); ...``: what an error or a warning names."""
    return "; ".join(f"{r.owner}.{r.name} ({r.kind}: {r.why})" for r in gone)

"""Fast positional constructors for frozen slots dataclasses, for objects built per resume.

A frozen dataclass's ``__init__`` sets each field through
``object.__setattr__`` (its own ``__setattr__`` refuses), takes keywords and
defaults, and runs ``__post_init__``: for a cursor that checks its own fields
again, costing more than the rest of its parse (figures in
``docs/benchmarks.md``, "The core's hot paths"). Where the values are
known good (a cursor just matched by its pattern, facts just decoded, a
verdict the rules just reached), :func:`builder` gives a function that takes
every field positionally and writes each slot through its descriptor, which
is what the class itself would store: the object is equal to, hashes like and
is as immutable as one built by the class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["builder"]

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """``build(field1, field2, ...)``: an instance of ``cls``, every field given, in field order.

    No ``__init__`` and no ``__post_init__`` run: the caller vouches for the
    values. Wrong arity raises :class:`TypeError`, as a plain function does.
    """
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        raise TypeError(f"{cls!r} is not a dataclass")
    params: Any = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen slots dataclass")
    names = [f.name for f in dataclasses.fields(cls)]
    setters = {f"_set_{name}": cls.__dict__[name].__set__ for name in names}
    body = "".join(f"        _set_{name}(self, {name})\n" for name in names)
    source = (
        f"def _make(_new, _cls, {', '.join(setters)}):\n"
        f"    def build({', '.join(names)}):\n"
        f"        self = _new(_cls)\n"
        f"{body}"
        f"        return self\n"
        f"    return build\n"
    )
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # built from the dataclass's own field names
    build: Callable[..., T] = namespace["_make"](object.__new__, cls, **setters)
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build

"""Fast positional constructors for frozen slots dataclasses, for objects built per resume.

A frozen dataclass's ``__init__`` sets each field through
``object.__setattr__`` (its own ``__setattr__`` refuses), takes keywords and
defaults, and runs ``__post_init__``: for a cursor that checks its own fields
again, costing more than the rest of its parse (figures in
``docs/benchmarks.md``, "The core's hot paths"). Where the values are
known good (a cursor just matched by its pattern, facts just decoded, a
verdict the rules just reached), :func:`builder` gives a function that takes
every field positionally and stores each in its slot, which is what the class
itself would store: the object is equal to, hashes like and is as immutable
as one built by the class.
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

    The object is born an instance of a plain twin of ``cls`` (the same
    slots, nothing else), whose slots take plain attribute stores, then made
    an instance of ``cls`` by setting its ``__class__``: Python allows that
    between classes of one layout, and it costs less than one call of a
    slot's descriptor per field. (A class whose layout its twin cannot
    match gets its slots set through their descriptors.)
    """
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        raise TypeError(f"{cls!r} is not a dataclass")
    params: Any = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen slots dataclass")
    names = [f.name for f in dataclasses.fields(cls)]
    twin = type(f"{cls.__name__}Twin", (), {"__slots__": cls.__dict__["__slots__"]})
    build = _compile(cls, names, twin) if _same_layout(cls, twin) else _compile(cls, names, None)
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build


def _same_layout(cls: type, twin: type) -> bool:
    """Whether an instance of ``twin`` can become one of ``cls`` (same slots, same base)."""
    if cls.__bases__ != (object,):
        return False
    probe: Any = object.__new__(twin)
    try:
        _set_class(probe, cls)
    except TypeError:
        return False
    return True


def _compile(cls: type[T], names: list[str], twin: type | None) -> Callable[..., T]:
    """The builder's code: plain stores into a ``twin`` then its class set, or without one,
    each slot set through its descriptor."""
    if twin is not None:
        captured: dict[str, Any] = {"_twin": twin, "_set_class": _set_class}
        body = "".join(f"        _built_.{name} = {name}\n" for name in names)
        first, last = "_new(_twin)", "        _set_class(_built_, _cls)\n"
    else:
        owners = {name: next(k for k in cls.__mro__ if name in k.__dict__) for name in names}
        captured = {f"_set_{name}": owners[name].__dict__[name].__set__ for name in names}
        body = "".join(f"        _set_{name}(_built_, {name})\n" for name in names)
        first, last = "_new(_cls)", ""
    source = (
        f"def _make(_new, _cls, {', '.join(captured)}):\n"
        f"    def build({', '.join(names)}):\n"
        f"        _built_ = {first}\n"
        f"{body}{last}"
        f"        return _built_\n"
        f"    return build\n"
    )
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # built from the dataclass's own field names
    build: Callable[..., T] = namespace["_make"](object.__new__, cls, **captured)
    return build


#: Sets an object's class (``obj.__class__ = cls``, past a frozen class's ``__setattr__``).
_set_class = object.__dict__["__class__"].__set__

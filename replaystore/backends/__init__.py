"""Backend registry: a URL scheme names the backend, as in ``limits``.

Built-in schemes: ``memory://`` (in-process, the default), ``redis://``,
``rediss://``, ``redis+unix://``, ``redis+cluster://``, ``redis+sentinel://``.
A third-party backend subclasses :class:`Backend` and calls
:func:`register_backend`; to serve MCP replicas it also declares how they
coordinate (:mod:`replaystore.backends.coordination`).
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import urlsplit

from ..errors import UnsupportedURLError
from ..retention import Retention
from .base import Backend

__all__ = ["Backend", "backend_from_url", "register_backend", "registered_schemes"]

_REGISTRY: dict[str, type[Backend]] = {}
# Built-ins are imported on first use, so `memory://` never imports redis.
_LAZY: dict[str, str] = {
    "memory": "replaystore.backends.memory",
    "redis": "replaystore.backends.redis",
    "rediss": "replaystore.backends.redis",
    "redis+unix": "replaystore.backends.redis",
    "unix": "replaystore.backends.redis",
    "redis+cluster": "replaystore.backends.redis",
    "rediss+cluster": "replaystore.backends.redis",
    "redis+sentinel": "replaystore.backends.redis",
}


def register_backend(backend: type[Backend]) -> type[Backend]:
    """Register ``backend`` for each scheme in ``backend.schemes`` (usable as a decorator)."""
    if not backend.schemes:
        raise ValueError(f"{backend.__name__} declares no URL schemes")
    for scheme in backend.schemes:
        _REGISTRY[scheme.lower()] = backend
    return backend


def registered_schemes() -> list[str]:
    return sorted(set(_REGISTRY) | set(_LAZY))


def backend_from_url(url: str, retention: Retention, **options: Any) -> Backend:
    """Build the backend that ``url``'s scheme names."""
    if not isinstance(url, str) or "://" not in url:
        raise UnsupportedURLError(f"not a storage URL: {url!r} (try 'memory://')")
    scheme = urlsplit(url).scheme.lower()
    if scheme not in _REGISTRY and scheme in _LAZY:
        _import_builtin(scheme)
    backend = _REGISTRY.get(scheme)
    if backend is None:
        raise UnsupportedURLError(
            f"no backend for scheme {scheme!r}; known: {', '.join(registered_schemes())}"
        )
    return backend.from_url(url, retention, **options)


def _import_builtin(scheme: str) -> None:
    """Import the built-in backend of ``scheme``; say what to install when that fails."""
    module = _LAZY[scheme]
    if module == _LAZY["memory"]:
        importlib.import_module(module)
        return
    try:
        # The package checks the installed redis-py before importing any of it,
        # and its ImportError says what to install.
        importlib.import_module(module)
    except ImportError as exc:
        raise UnsupportedURLError(f"{scheme}:// is unavailable: {exc}") from exc

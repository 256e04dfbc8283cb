"""The error model: one base class for everything raised on purpose, and where each class lives."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

import replaystore
import replaystore.errors
import replaystore.verdicts
from replaystore import (
    CursorError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    ReplayStoreError,
    ResumptionDesyncError,
    SequenceTagCollisionError,
    StorageError,
    StoreRegressedError,
    UnknownSessionError,
    UnsupportedURLError,
)
from replaystore.mcp import SDKCompatibilityError

# Each exported class, and the built-in class code written before it may catch.
BUILTIN_BASES: dict[type[ReplayStoreError], type[Exception]] = {
    CursorError: ValueError,
    InvalidInputError: ValueError,
    SequenceTagCollisionError: InvalidInputError,
    IdempotencyKeyReusedError: InvalidInputError,
    UnknownSessionError: LookupError,
    StoreRegressedError: UnknownSessionError,
    StorageError: ReplayStoreError,
    UnsupportedURLError: ValueError,
    ResumptionDesyncError: RuntimeError,
    SDKCompatibilityError: ImportError,
}


def _exported_exceptions() -> set[type[BaseException]]:
    found = set()
    for module in (replaystore, replaystore.mcp):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and issubclass(value, BaseException):
                found.add(value)
    return found


def test_every_exported_exception_derives_from_replaystore_error():
    exported = _exported_exceptions()
    assert exported == {ReplayStoreError, *BUILTIN_BASES}
    for cls in exported:
        assert issubclass(cls, ReplayStoreError), cls


@pytest.mark.parametrize("cls", list(BUILTIN_BASES), ids=lambda c: c.__name__)
def test_each_error_keeps_its_builtin_base(cls):
    assert issubclass(cls, BUILTIN_BASES[cls])


def test_errors_module_imports_nothing_of_the_package():
    """No module-level import of the package (``TYPE_CHECKING`` blocks do not run); runs alone."""
    path = Path(replaystore.errors.__file__)
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("replaystore"), node
        if isinstance(node, ast.Import):
            assert not any(alias.name.startswith("replaystore") for alias in node.names)
    # Executed outside the package, a relative import would fail.
    spec = importlib.util.spec_from_file_location("standalone_errors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.SequenceTagCollisionError, module.InvalidInputError)


def test_errors_defines_every_exception_it_exports() -> None:
    """Each class of ``errors.__all__`` is defined there (none looked up elsewhere on use)."""
    for name in replaystore.errors.__all__:
        assert getattr(replaystore.errors, name).__module__ == "replaystore.errors", name
    with pytest.raises(AttributeError, match="NoSuchError"):
        _ = replaystore.errors.NoSuchError  # type: ignore[attr-defined]


def test_resumption_desync_error_lives_beside_the_verdict_it_carries() -> None:
    """One home, so one import path: ``errors`` does not name it, even for annotations."""
    assert ResumptionDesyncError is replaystore.verdicts.ResumptionDesyncError
    assert ResumptionDesyncError.__module__ == "replaystore.verdicts"
    assert "ResumptionDesyncError" in replaystore.verdicts.__all__
    assert not hasattr(replaystore.errors, "ResumptionDesyncError")
    assert "verdicts" not in Path(replaystore.errors.__file__).read_text().split('"""', 2)[2]


def test_new_errors_say_what_was_refused():
    collision = SequenceTagCollisionError("tool-7")
    assert collision.sequence == "tool-7" and "'tool-7'" in str(collision)
    reused = IdempotencyKeyReusedError("req-1")
    assert reused.key == "req-1" and "'req-1'" in str(reused)

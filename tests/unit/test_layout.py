"""The layout stays readable: no import cycle, leaves stay leaves, modules and folders small.

Checked on the sources. An import is an edge wherever it is written: at the
top of a module or inside a function (it runs when the function is called,
and a cycle there is a cycle all the same, only later). Imports under
``TYPE_CHECKING`` are not edges: they never run.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

import replaystore

ROOT = Path(replaystore.__file__).parent

#: Folders of shipped code hold at most this many modules of their own ideas
#: (``__init__.py`` and ``__main__.py``, a package's doors, not counted).
MAX_MODULES_PER_FOLDER = 12


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("replaystore", *path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _walk_outside_type_checking(node: ast.AST) -> list[ast.AST]:
    """``node`` and what it holds, except ``if TYPE_CHECKING:`` bodies (they never run)."""
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        return [sub for child in node.orelse for sub in _walk_outside_type_checking(child)]
    found = [node]
    for child in ast.iter_child_nodes(node):
        found += _walk_outside_type_checking(child)
    return found


def _imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports, at its top or inside its functions."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps: set[str] = set()
    for sub in _walk_outside_type_checking(ast.parse(path.read_text())):
        if isinstance(sub, ast.ImportFrom):
            if sub.level:
                base = package.split(".")[: len(package.split(".")) - sub.level + 1]
                target = ".".join([*base, *([sub.module] if sub.module else [])])
            else:
                target = sub.module or ""
            submodules = {f"{target}.{alias.name}" for alias in sub.names} & set(MODULES)
            # ``from . import x`` names the submodule; the package itself is not re-run
            if target in MODULES and not (submodules and not sub.module):
                deps.add(target)
            deps |= submodules
        elif isinstance(sub, ast.Import):
            deps |= {alias.name for alias in sub.names} & set(MODULES)
    return deps - {name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        for dep in sorted(graph[name]):
            found = visit(dep, [*path, name])
            if found:
                return found
        done.add(name)
        return None

    for name in sorted(graph):
        found = visit(name, [])
        if found:
            return found
    return None


def test_no_import_cycle() -> None:
    graph = {name: _imports(name) for name in MODULES}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_imports_inside_functions() -> None:
    """A module importing, inside a function, one that imports it is a cycle."""
    graph = {name: _imports(name) for name in MODULES}
    assert "replaystore.mcp.example" in graph["replaystore.cli"]  # inside ``main``
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_leaf_modules_import_nothing_else_of_the_package() -> None:
    """Any module may depend on these without risking a cycle."""
    for leaf in (
        "replaystore.errors",
        "replaystore.mcp.settings",
        "replaystore.backends.coordination",
        "replaystore.backends.session_registry",
        "replaystore.backends.notifications",
        "replaystore._seams",
        "replaystore.backends.redis.keys",
    ):
        assert _imports(leaf) == set(), leaf


def test_shipped_modules_stay_small() -> None:
    """Every module but the test helpers of ``replaystore.testing`` fits in 700 lines."""
    sizes = {
        name: len(path.read_text().splitlines())
        for name, path in MODULES.items()
        if not name.startswith("replaystore.testing")
    }
    too_long = {name: size for name, size in sizes.items() if size > 700}
    assert sizes and not too_long, too_long


def _folder_sizes() -> Counter[str]:
    """Modules per folder of shipped code, ``replaystore.testing`` included: it ships too."""
    return Counter(
        str(path.parent.relative_to(ROOT.parent))
        for path in MODULES.values()
        if path.name not in ("__init__.py", "__main__.py")
    )


FOLDERS = sorted(_folder_sizes())


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folder_holds_few_modules(folder: str) -> None:
    """A folder one can hold in one's head: split by idea past a dozen modules."""
    size = _folder_sizes()[folder]
    assert size <= MAX_MODULES_PER_FOLDER, (folder, size)


def test_the_folder_check_sees_every_folder() -> None:
    assert {"replaystore", "replaystore/mcp", "replaystore/mcp/sessions"} <= set(FOLDERS)

"""The layout stays readable: no run-time import cycle, leaves stay leaves, modules small.

Checked on the sources (the imports a module runs when it is imported: its
top-level statements, not those under ``TYPE_CHECKING`` nor inside functions).
"""

from __future__ import annotations

import ast
from pathlib import Path

import replaystore

ROOT = Path(replaystore.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("replaystore", *path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _walk_outside_functions(node: ast.AST) -> list[ast.AST]:
    """``node`` and what it holds, except the bodies of functions (they run when called)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        return []
    found = [node]
    for child in ast.iter_child_nodes(node):
        found += _walk_outside_functions(child)
    return found


def _runtime_imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports when it is imported."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in _walk_outside_functions(node):
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


def test_no_runtime_import_cycle() -> None:
    graph = {name: _runtime_imports(name) for name in MODULES}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_leaf_modules_import_nothing_else_of_the_package() -> None:
    """Any module may depend on these without risking a cycle."""
    for leaf in (
        "replaystore.mcp.settings",
        "replaystore.backends.coordination",
        "replaystore._seams",
        "replaystore.backends.redis.keys",
    ):
        assert _runtime_imports(leaf) == set(), leaf


def test_shipped_modules_stay_small() -> None:
    """Every module but the test helpers of ``replaystore.testing`` fits in 700 lines."""
    sizes = {
        name: len(path.read_text().splitlines())
        for name, path in MODULES.items()
        if not name.startswith("replaystore.testing")
    }
    too_long = {name: size for name, size in sizes.items() if size > 700}
    assert sizes and not too_long, too_long

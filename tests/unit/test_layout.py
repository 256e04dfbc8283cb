"""The layout stays readable: no import circle, no reaching into another module's privates.

Checked on the sources:

- No import circle. An import is an edge wherever it is written: at the top
  of a module, inside a function (it runs when the function is called: a
  circle there is a circle all the same, only later) or under
  ``TYPE_CHECKING`` (it never runs, but a reader follows it all the same:
  two modules naming each other's types are one idea in two files).
- Leaves stay leaves.
- No module imports another module's private name (a ``_name`` that is not a
  module), and private modules of other distributions are named only where
  their use is checked against upstream (``mcp/_sdk/``, ``backends/redis/redispy.py``).
- The MCP layer outside ``mcp/_sdk/`` touches no other object's private
  attribute: the SDK's private parts are reached through ``_sdk`` only.
- A few catch-all handlers in the backends, each at a boundary that must not
  die: anything else a backend does not expect is a bug, and propagates as one.
- A folder one can hold in one's head: at most a dozen modules. Modules are
  split by role, never by size (``docs/architecture.md``): there is no line cap.
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


#: Sources the scans read instead of a module's file (their own test's examples).
_SOURCES: dict[str, str] = {}


def _tree(name: str) -> ast.Module:
    return ast.parse(_SOURCES.get(name) or MODULES[name].read_text())


def _target(name: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module ``node`` (in module ``name``) imports from."""
    is_package = name in MODULES and MODULES[name].name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports: at its top, in functions, for type checking."""
    deps: set[str] = set()
    for sub in ast.walk(_tree(name)):
        if isinstance(sub, ast.ImportFrom):
            target = _target(name, sub)
            submodules = {f"{target}.{alias.name}" for alias in sub.names} & set(MODULES)
            # ``from . import x`` names the submodule; the package itself is not re-run
            if target in MODULES and not (submodules and not sub.module):
                deps.add(target)
            deps |= submodules
        elif isinstance(sub, ast.Import):
            deps |= {alias.name for alias in sub.names} & set(MODULES)
    return deps - {name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of ``graph``: the sets of modules that reach each other, sorted."""
    reach = {name: _reachable(graph, name) for name in graph}
    circles = {
        tuple(sorted(other for other in reach[name] if name in reach[other]))
        for name in graph
        if name in reach[name]
    }
    return sorted(list(circle) for circle in circles)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph.get(name, ())
    return seen


def test_no_import_cycle() -> None:
    graph = {name: _imports(name) for name in MODULES}
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_cycle_check_sees_imports_inside_functions_and_for_type_checking() -> None:
    """A module importing one that imports it is a cycle, wherever the import is written."""
    graph = {name: _imports(name) for name in MODULES}
    assert "replaystore.mcp.example" in graph["replaystore.commands.cli"]  # inside ``main``
    probe = "replaystore._layout_probe"
    _SOURCES[probe] = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .cursor import Cursor\n"
        "def f():\n"
        "    from .errors import StorageError\n"
    )
    try:
        assert _imports(probe) == {"replaystore.cursor", "replaystore.errors"}
    finally:
        del _SOURCES[probe]
    assert _circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_leaf_modules_import_nothing_else_of_the_package() -> None:
    """Any module may depend on these without risking a cycle."""
    for leaf in (
        "replaystore.errors",
        "replaystore.mcp.settings",
        "replaystore.backends.session_registry",
        "replaystore.backends.notifications",
        "replaystore._seams",
        "replaystore.backends.redis.keys",
    ):
        assert _imports(leaf) == set(), leaf


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


#: The modules that name other distributions' private modules, each such use
#: checked against the upstream source it was written for (``_seams.py``).
PRIVATE_SEAMS = ("replaystore.mcp._sdk", "replaystore.backends.redis.redispy")


def _private_imports(name: str) -> list[str]:
    """``from x import _y`` where ``x._y`` is no module; a foreign private module outside a seam."""
    found = []
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.ImportFrom):
            target = _target(name, node)
            found += [
                f"{name}:{node.lineno} from {target} import {alias.name}"
                for alias in node.names
                if _private(alias.name) and f"{target}.{alias.name}" not in MODULES
            ]
            modules = [target]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [
            f"{name}:{node.lineno} imports the private module {module}"
            for module in modules
            if not module.startswith("replaystore")
            and any(_private(part) for part in module.split("."))
            and not name.startswith(PRIVATE_SEAMS)
        ]
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    found = [line for name in sorted(MODULES) for line in _private_imports(name)]
    assert not found, "\n".join(found)


def _private_attributes(name: str) -> list[str]:
    """``obj._x`` with ``obj`` not ``self``, ``cls`` or ``super()``; ``getattr(obj, "_x")`` too."""
    found = []
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
                continue
            found.append(f"{name}:{node.lineno} {ast.unparse(owner)}.{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            found.append(f"{name}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_the_mcp_layer_touches_no_other_objects_private_attribute() -> None:
    """Outside ``mcp/_sdk/``: an SDK upgrade renaming a private part breaks one checked place."""
    found = [
        line
        for name in sorted(MODULES)
        if name.startswith("replaystore.mcp") and not name.startswith("replaystore.mcp._sdk")
        for line in _private_attributes(name)
    ]
    assert not found, "\n".join(found)


#: Catch-all handlers (``except Exception``, ``except BaseException``, a bare
#: ``except``) the backends may hold: each at a boundary that must not die.
MAX_CATCH_ALLS_IN_BACKENDS = 3


def _catch_alls(name: str) -> list[str]:
    found = []
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.ExceptHandler):
            kinds = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            named = {ast.unparse(kind) for kind in kinds if kind is not None}
            if node.type is None or named & {"Exception", "BaseException"}:
                found.append(f"{name}:{node.lineno} except {', '.join(sorted(named)) or '(bare)'}")
    return found


def test_the_backends_hold_few_catch_all_handlers() -> None:
    """A bug in a backend propagates as the bug it is, never as a store outage."""
    found = [
        line
        for name in sorted(MODULES)
        if name.startswith("replaystore.backends")
        for line in _catch_alls(name)
    ]
    assert len(found) <= MAX_CATCH_ALLS_IN_BACKENDS, "\n".join(found)


def test_the_scans_find_what_they_look_for() -> None:
    """Each scan flags a written example (a scan finding nothing would pass anything)."""
    probe = "replaystore._layout_probe"
    _SOURCES[probe] = (
        "from __future__ import annotations\n"
        "import mcp.server._private\n"
        "from .cursor import _HEX, Cursor\n"
        "from . import _frozen\n"
        "def f(other, self):\n"
        "    try:\n"
        "        return other._x, self._y, super()._z, getattr(other, '_w'), other.__class__\n"
        "    except (ValueError, Exception):\n"
        "        pass\n"
        "    except:\n"
        "        pass\n"
    )
    try:
        assert [line.split(" ", 1)[1] for line in _private_imports(probe)] == [
            "imports the private module mcp.server._private",
            "from replaystore.cursor import _HEX",
        ]
        assert [line.split(" ", 1)[1] for line in _private_attributes(probe)] == [
            "other._x",
            "getattr(..., '_w')",
        ]
        assert [line.split(" ", 1)[1] for line in _catch_alls(probe)] == [
            "except Exception, ValueError",
            "except (bare)",
        ]
    finally:
        del _SOURCES[probe]


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

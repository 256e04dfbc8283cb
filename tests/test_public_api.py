"""What the README, the docs and the examples import is the public API, and nothing else.

A public module is a package (an ``__init__.py``) that declares ``__all__``
and has no part of its dotted name starting with ``_``. Every ``from
replaystore… import …`` and ``import replaystore…`` written in ``README.md``,
``docs/**/*.md`` and ``examples/**/*.py`` must import a public module, and
only names of its ``__all__``; so a user copying them never depends on a
module that may change between releases. The other way round, every name the
MCP packages export is named in the docs.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))

#: The packages of the MCP layer's public API.
MCP_PUBLIC = (
    "replaystore.mcp",
    "replaystore.mcp.tasks",
    "replaystore.mcp.client",
    "replaystore.mcp.fastmcp",
)

_FROM = re.compile(r"^\s*from\s+(replaystore[\w.]*)\s+import\s+\(?([\w\s,]+?)\)?\s*(?:#.*)?$")
_IMPORT = re.compile(r"^\s*import\s+(replaystore[\w.]*)(?:\s+as\s+\w+)?\s*(?:#.*)?$")


def _imports_in_text(text: str) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of each import line of Markdown (names empty for ``import m``)."""
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if match := _FROM.match(line):
            names = [n.strip().split(" as ")[0] for n in match.group(2).split(",") if n.strip()]
            found.append((match.group(1), names))
        elif match := _IMPORT.match(line):
            found.append((match.group(1), []))
    return found


def _imports_in_python(source: str) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("replaystore"):
            found.append((node.module or "", [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("replaystore")]
    return found


def _documented_imports() -> list[tuple[str, str, list[str]]]:
    found = [(p.name, m, n) for p in DOCS for m, n in _imports_in_text(p.read_text())]
    found += [(p.name, m, n) for p in EXAMPLES for m, n in _imports_in_python(p.read_text())]
    return found


def _is_public(module_name: str) -> bool:
    module = importlib.import_module(module_name)
    is_package = Path(module.__file__ or "").name == "__init__.py"
    private = any(part.startswith("_") for part in module_name.split("."))
    return is_package and hasattr(module, "__all__") and not private


IMPORTS = _documented_imports()


def test_the_docs_and_examples_import_from_replaystore() -> None:
    """The scan finds what it checks (a scan finding nothing would pass anything)."""
    modules = {module for _, module, _ in IMPORTS}
    assert {
        "replaystore",
        "replaystore.mcp",
        "replaystore.mcp.tasks",
        "replaystore.mcp.client",
    } <= modules
    assert _imports_in_text(
        "from replaystore.x import (A, b as c)  # why\nimport replaystore.y"
    ) == [
        ("replaystore.x", ["A", "b"]),
        ("replaystore.y", []),
    ]


@pytest.mark.parametrize(
    ("where", "module", "names"), IMPORTS, ids=[f"{w}:{m}" for w, m, _ in IMPORTS]
)
def test_each_documented_import_names_a_public_export(
    where: str, module: str, names: list[str]
) -> None:
    assert _is_public(module), f"{where} imports the internal module {module}"
    exported = importlib.import_module(module).__all__
    assert set(names) <= set(exported), (where, module, set(names) - set(exported))


def test_internal_modules_are_not_public() -> None:
    for internal in (
        "replaystore.mcp.tasks.extension",
        "replaystore.mcp.sessions",
        "replaystore.mcp._sdk",
        "replaystore.verdicts",
    ):
        assert not _is_public(internal), internal


@pytest.mark.parametrize("package", MCP_PUBLIC)
def test_every_mcp_export_resolves_and_is_documented(package: str) -> None:
    module = importlib.import_module(package)
    docs = "\n".join(p.read_text() for p in DOCS)
    for name in module.__all__:
        assert getattr(module, name) is not None, (package, name)
        assert re.search(rf"\b{name}\b", docs), f"{package}.{name} is exported but no doc names it"

"""The tests' own layout: folders mirror the code's, and test modules never import each other.

A test module that imports another one runs that module's fixtures and tests
under a second name, and ties two files together that read as independent;
what several modules share lives in a ``_support.py`` (or a conftest) beside
them. The rules are in ``tests/README.md``.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

#: Folders of ``tests/`` that gather tests across the code instead of mirroring a folder of it.
CATEGORIES = {"conformance", "faults", "hostile", "unit", "plugins"}
#: Where a mirroring folder's code lives: ``tests/X/Y`` tests ``replaystore/X/Y`` or ``X/Y``.
CODE_ROOTS = (ROOT / "replaystore", ROOT)


def _module_of(path: Path, tests: Path) -> list[str]:
    return ["tests", *path.relative_to(tests).with_suffix("").parts]


def _folders() -> list[Path]:
    """The folders under ``tests/`` that hold sources (no caches, nothing hidden)."""
    return sorted(
        p
        for p in TESTS.rglob("*")
        if p.is_dir()
        and not any(part.startswith((".", "__")) for part in p.relative_to(TESTS).parts)
    )


def imported_modules(path: Path, tests: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import is written, relative ones resolved."""
    here = _module_of(path, tests)
    package = here[:-1] if path.name != "__init__.py" else here
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = [*base, *(node.module.split(".") if node.module else [])]
            found.add(".".join(module))
            # ``from tests.mcp import test_http`` imports a module too.
            found.update(".".join([*module, alias.name]) for alias in node.names)
    return found


def imports_of_test_modules(tests: Path) -> list[str]:
    """``file: module`` for each import of a ``test_*`` module by any module under ``tests``."""
    bad = []
    for path in sorted(tests.rglob("*.py")):
        for module in sorted(imported_modules(path, tests)):
            last = module.rsplit(".", 1)[-1]
            if module.split(".")[0] == "tests" and last.startswith("test_"):
                bad.append(f"{path.relative_to(tests.parent)}: {module}")
    return bad


def test_no_test_module_imports_another() -> None:
    assert imports_of_test_modules(TESTS) == []


def test_an_import_of_a_test_module_is_found(tmp_path: Path) -> None:
    """The check sees each spelling: absolute, relative, ``from package import test_x``, nested."""
    tests = tmp_path / "tests"
    (tests / "mcp").mkdir(parents=True)
    (tests / "mcp" / "test_a.py").write_text(
        "import tests.mcp.test_b as b\n"
        "from .test_c import helper\n"
        "from . import test_d\n"
        "def f():\n    from tests.mcp.test_e import x\n"
        "from tests.mcp._support import fine\n"
    )
    assert imports_of_test_modules(tests) == [
        "tests/mcp/test_a.py: tests.mcp.test_b",
        "tests/mcp/test_a.py: tests.mcp.test_c",
        "tests/mcp/test_a.py: tests.mcp.test_d",
        "tests/mcp/test_a.py: tests.mcp.test_e",
    ]


def test_folders_mirror_the_code_or_are_a_category() -> None:
    """``tests/mcp/sessions`` tests ``replaystore/mcp/sessions``; a folder named after nothing is
    a category (and listed here), so a test's place says what it tests."""
    strays = []
    for folder in _folders():
        relative = folder.relative_to(TESTS)
        if relative.parts[0] in CATEGORIES:
            continue
        if not any((root / relative).is_dir() for root in CODE_ROOTS):
            strays.append(str(relative))
    assert strays == []


def test_every_test_folder_is_a_package() -> None:
    """Test modules are imported as ``tests.<folder>.<module>``: two folders may hold one name."""
    missing = [
        str(folder.relative_to(ROOT))
        for folder in [TESTS, *_folders()]
        if any(folder.glob("*.py")) and not (folder / "__init__.py").exists()
    ]
    assert missing == []


def test_the_long_modules_dealt_out_first_exist() -> None:
    """A module moved or renamed is dealt out late again: its entry must follow it."""
    from tests.plugins.schedule import LONG_MODULES

    assert [m for m in LONG_MODULES if not (ROOT / m).is_file()] == []

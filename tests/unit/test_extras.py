"""``pip install 'replaystore[bench]'`` installs every module ``replaystore bench`` imports.

A fresh venv per run would take minutes on the suite's budget, so the check
is static: every module the bench code imports (at the top or inside a
function), and every module of the package it reaches from there, is walked;
each third-party top-level module must belong to a distribution that the
extra requires, directly or through the requirements of what it requires
(read from ``pyproject.toml`` for the package itself, from the installed
metadata for the rest). Imports guarded by ``except ImportError`` are
optional by construction and left out.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "replaystore"


def _module_path(name: str) -> Path | None:
    """The source file of ``replaystore.x.y`` (a module or a package's ``__init__``)."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _optional(tree: ast.AST) -> set[int]:
    """Line numbers of imports inside ``try: ... except ImportError`` (or its parents)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = {
            n.id
            for h in node.handlers
            for n in ast.walk(h.type or ast.Name("BaseException"))
            if isinstance(n, ast.Name)
        }
        if caught & {"ImportError", "ModuleNotFoundError"}:
            lines |= {n.lineno for s in node.body for n in ast.walk(s) if hasattr(n, "lineno")}
    return lines


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of every module ``path`` (the module ``module``) imports, not optionally."""
    tree = ast.parse(path.read_text())
    optional = _optional(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in optional:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.add(name)
            # ``from . import x``: x may be a module of its own
            found |= {f"{name}.{a.name}" for a in node.names if _module_path(f"{name}.{a.name}")}
    return found


def third_party_imports(start: str) -> set[str]:
    """Top-level third-party modules reached from the package ``start``, through the package."""
    queue = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT.joinpath(*start.split("."))).rglob("*.py")
    ]
    seen: set[str] = set()
    outside: set[str] = set()
    while queue:
        module = queue.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_path(module)
        if path is None:
            continue
        for name in _imports(path, module):
            top = name.partition(".")[0]
            if top == "replaystore":
                # importing a.b.c runs a/__init__ and a/b/__init__ too
                parts = name.split(".")
                queue += [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
            elif top not in sys.stdlib_module_names and top != "__future__":
                outside.add(top)
    return outside


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def extra_closure(extra: str) -> set[str]:
    """Every distribution ``pip install 'replaystore[extra]'`` installs (normalized names)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    own: dict[str | None, list[str]] = {
        None: project["dependencies"],
        **project["optional-dependencies"],
    }
    todo: list[tuple[str, str | None]] = [("replaystore", extra)]
    done: set[tuple[str, str | None]] = set()
    dists: set[str] = set()
    while todo:
        dist, wanted = todo.pop()
        if (dist, wanted) in done:
            continue
        done.add((dist, wanted))
        dists.add(dist)
        if dist == "replaystore":
            texts = [*own[None], *(own[wanted] if wanted else [])]
            env_extra = ""
        else:
            texts = metadata.requires(dist) or []
            env_extra = wanted or ""
        for text in texts:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": env_extra}):
                continue
            name = _norm(req.name)
            todo.append((name, None))
            todo += [(name, e) for e in req.extras]
    return dists


def test_the_bench_extra_installs_every_module_bench_imports() -> None:
    needed = third_party_imports("replaystore.bench")
    assert {"matplotlib", "httpx", "uvicorn"} <= needed  # the walk sees lazy imports too
    providers = metadata.packages_distributions()
    installed = extra_closure("bench")
    missing = {
        module: providers.get(module)
        for module in sorted(needed)
        if not {_norm(d) for d in providers.get(module, [module])} & installed
    }
    assert not missing, f"imported by replaystore bench, not installed by [bench]: {missing}"

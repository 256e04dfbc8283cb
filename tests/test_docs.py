"""Every Python block of the README and of ``docs/`` is complete, and runs as written.

Each ```python block is compiled as a file of its own (a top-level ``await``
or ``async with`` is a syntax error there) and every name it uses must be
bound in it or be a builtin: a fragment imports what it uses. The names are
resolved with the compiler's own symbol tables (:mod:`symtable`), scope by
scope, so a name bound in a function does not hide one missing elsewhere.

Then each block runs, pasted into a file, all of them in one interpreter (one
start-up for the lot: importing the SDK and FastMCP dominates), so a block's
imports must exist and its calls must take the arguments it gives. A block
that needs a server to talk to keeps that in an ``async def main()`` it does
not call; one that cannot run at all says why on the line before its fence,
``<!-- not run: the reason -->``, and is only checked. A block followed by
"It prints:" and a ```text block must print exactly that. A block that names
``redis://localhost:6379/0`` runs against the test session's own
redis-server instead (tests never touch a machine's Redis).
"""

from __future__ import annotations

import builtins
import json
import re
import subprocess
import symtable
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.servers import RealServers

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
LOCAL_REDIS = "redis://localhost:6379/0"

_BLOCK = re.compile(r"^```python\n(.*?)^```\n", re.S | re.M)
_PRINTS = re.compile(r"\s*It prints:\s*```text\n(.*?)^```\n", re.S | re.M)
_NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    heading: str
    code: str
    prints: str | None
    #: Why the block is only checked, not run (None: it runs).
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def doc_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    blocks: list[Block] = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start()]
        headings = re.findall(r"^#+ (.+)$", before, re.M)
        expected = _PRINTS.match(text, match.end())
        marker = _NOT_RUN.search(before)
        blocks.append(
            Block(
                page=str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name,
                line=before.count("\n") + 1,
                heading=headings[-1] if headings else "top",
                code=match.group(1),
                prints=expected.group(1) if expected else None,
                not_run=marker.group(1) if marker else None,
            )
        )
    return blocks


BLOCKS = [block for page in PAGES for block in doc_blocks(page)]
RUN = [b for b in BLOCKS if b.not_run is None]


def unbound_names(code: str, filename: str) -> set[str]:
    """Names ``code`` reads that nothing in it binds and that are not builtins."""
    top = symtable.symtable(code, filename, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    known = bound | set(dir(builtins))
    missing: set[str] = set()

    def visit(table: symtable.SymbolTable) -> None:
        for sym in table.get_symbols():
            at_top = table is top or sym.is_global()
            if sym.is_referenced() and at_top and sym.get_name() not in known:
                missing.add(sym.get_name())
        for child in table.get_children():
            visit(child)

    visit(top)
    return missing


def test_a_block_marked_not_run_is_only_checked(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A\n\n<!-- not run: needs a GPU -->\n```python\nimport x\n```\n\n"
        "Then:\n\n```python\nprint(1)\n```\n\nIt prints:\n\n```text\n1\n```\n"
    )
    first, second = doc_blocks(page)
    assert (first.not_run, first.line, first.code) == ("needs a GPU", 4, "import x\n")
    assert (second.not_run, second.prints) == (None, "1\n")


def test_the_checks_find_what_a_snippet_lacks() -> None:
    """The check can fail: an undefined name in a function, a top-level ``async with``."""
    assert unbound_names(
        "import anyio\nasync def f() -> None:\n    await manager.run()\n", "x"
    ) == {"manager"}
    assert unbound_names("def f(x: Q = [z for z in w]):\n    return x, print\n", "x") == {
        "Q",
        "w",
    }
    with pytest.raises(SyntaxError):
        compile("async with open('x') as f:\n    pass\n", "x", "exec")


def test_the_pages_have_blocks_and_the_readme_a_usage_block_with_its_output() -> None:
    assert {b.page for b in BLOCKS} >= {"README.md", "docs/mcp.md", "docs/tasks.md"}
    usage = [b for b in BLOCKS if b.page == "README.md" and b.heading == "Usage"]
    assert usage, "no python block under ## Usage"
    assert usage[0].prints, "the Usage block says what it prints"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_is_complete(block: Block) -> None:
    compile(block.code, block.name, "exec")  # a SyntaxError names the line
    assert not unbound_names(block.code, block.name), f"{block.name} uses names it does not bind"


@pytest.fixture(scope="module")
def ran(real_servers: RealServers, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every block that runs, run in one interpreter, each from a file of its own."""
    work = tmp_path_factory.mktemp("docs")
    redis_url = real_servers.shared("redis").url
    files = []
    for n, block in enumerate(RUN):
        code = block.code.replace(LOCAL_REDIS, redis_url)
        assert "localhost:6379" not in code, f"{block.name}: a Redis URL the test cannot redirect"
        script = work / f"block{n}.py"
        script.write_text(code)
        files.append((block.name, str(script)))
    (work / "blocks.json").write_text(json.dumps(files))
    (work / "runner.py").write_text(_RUNNER)
    out = subprocess.run(
        [sys.executable, "runner.py", "blocks.json", "results.json"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results: dict[str, Any] = json.loads((work / "results.json").read_text())
    return results


_RUNNER = """\
import contextlib, io, json, runpy, sys, traceback

results = {}
with open(sys.argv[1]) as f:
    blocks = json.load(f)
for name, path in blocks:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        results[name] = {"ok": True, "out": out.getvalue()}
    except BaseException:
        results[name] = {"ok": False, "out": out.getvalue(), "error": traceback.format_exc()}
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


@pytest.mark.realserver
@pytest.mark.parametrize("block", RUN, ids=[b.name for b in RUN])
def test_block_runs_as_written(block: Block, ran: dict[str, Any]) -> None:
    result = ran[block.name]
    assert result["ok"], f"{block.name}:\n{result['out']}\n{result['error']}"
    if block.prints is not None:
        assert result["out"] == block.prints, f"{block.name} prints:\n{result['out']}"


# ------------------------------------------------- docs/guarantees.md

GUARANTEES = ROOT / "docs" / "guarantees.md"
_CITED = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def test_guarantees_cite_tests_that_exist() -> None:
    """Every ``file::test`` the guarantees page names is a test function in that file."""
    cited = _CITED.findall(GUARANTEES.read_text())
    assert len(cited) >= 40, "the page cites its tests"
    root = ROOT
    missing = []
    for path, name in cited:
        source = root / path
        defined = source.is_file() and re.search(
            rf"^(async )?def {name}\(", source.read_text(), re.M
        )
        if not defined:
            missing.append(f"{path}::{name}")
    assert not missing, f"cited but not defined: {missing}"

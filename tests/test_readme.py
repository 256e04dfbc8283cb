"""The README's Python code blocks run as written, pasted into a file.

Each ```python block runs in its own interpreter. A block followed by "It
prints:" and a ```text block must print exactly that. A block that names
``redis://localhost:6379/0`` runs against the test session's own
redis-server instead (tests never touch a machine's Redis).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.plugins.servers import RealServers

README = Path(__file__).resolve().parents[1] / "README.md"
LOCAL_REDIS = "redis://localhost:6379/0"

_BLOCK = re.compile(r"^```python\n(.*?)^```\n", re.S | re.M)
_PRINTS = re.compile(r"\s*It prints:\s*```text\n(.*?)^```\n", re.S | re.M)


@dataclass(frozen=True)
class Block:
    line: int
    heading: str
    code: str
    prints: str | None


def readme_blocks() -> list[Block]:
    text = README.read_text()
    blocks: list[Block] = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start()]
        headings = re.findall(r"^#+ (.+)$", before, re.M)
        expected = _PRINTS.match(text, match.end())
        blocks.append(
            Block(
                line=before.count("\n") + 1,
                heading=headings[-1] if headings else "top",
                code=match.group(1),
                prints=expected.group(1) if expected else None,
            )
        )
    return blocks


BLOCKS = readme_blocks()


def test_the_readme_has_a_usage_block_with_its_output() -> None:
    usage = [b for b in BLOCKS if b.heading == "Usage"]
    assert usage, "no python block under ## Usage"
    assert usage[0].prints, "the Usage block says what it prints"


@pytest.mark.realserver
@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.heading}-line{b.line}" for b in BLOCKS])
def test_readme_block_runs_as_written(
    block: Block, real_servers: RealServers, tmp_path: Path
) -> None:
    code = block.code
    if "redis://" in code:
        code = code.replace(LOCAL_REDIS, real_servers.shared("redis").url)
        assert "localhost:6379" not in code, "a Redis URL the test cannot redirect"
    script = tmp_path / "snippet.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, f"README line {block.line}:\n{out.stdout}\n{out.stderr}"
    if block.prints is not None:
        assert out.stdout == block.prints, f"README line {block.line} prints:\n{out.stdout}"


# ------------------------------------------------- docs/guarantees.md

GUARANTEES = README.parent / "docs" / "guarantees.md"
_CITED = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def test_guarantees_cite_tests_that_exist() -> None:
    """Every ``file::test`` the guarantees page names is a test function in that file."""
    cited = _CITED.findall(GUARANTEES.read_text())
    assert len(cited) >= 40, "the page cites its tests"
    root = README.parent
    missing = []
    for path, name in cited:
        source = root / path
        defined = source.is_file() and re.search(
            rf"^(async )?def {name}\(", source.read_text(), re.M
        )
        if not defined:
            missing.append(f"{path}::{name}")
    assert not missing, f"cited but not defined: {missing}"

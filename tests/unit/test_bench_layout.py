"""The benchmarks stay readable: few modules per folder, no function too long to follow.

``replaystore/bench`` (what users run) and ``benchmarks/`` (the targets and the
studies, run from a checkout) share one payload generator, one way to start
server processes and one concurrency helper; their functions are split into
planning, running and reporting, each short enough to read in one screen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import replaystore.bench

BENCH = Path(replaystore.bench.__file__).parent
BENCHMARKS = BENCH.parents[1] / "benchmarks"

MAX_MODULES = 12
MAX_FUNCTION_LINES = 70


def _folders(root: Path) -> list[Path]:
    return [root, *(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__")]


def test_every_bench_folder_holds_at_most_twelve_modules() -> None:
    counts = {folder: len(list(folder.glob("*.py"))) for folder in _folders(BENCH)}
    assert counts[BENCH] > 1
    crowded = {str(f.relative_to(BENCH.parent)): n for f, n in counts.items() if n > MAX_MODULES}
    assert not crowded, crowded


def _long_functions(root: Path) -> dict[str, int]:
    found = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"] = lines
    return found


def test_no_benchmark_function_is_longer_than_a_screen() -> None:
    assert BENCHMARKS.is_dir(), BENCHMARKS
    long = {**_long_functions(BENCH), **_long_functions(BENCHMARKS)}
    assert not long, long


def _where(predicate: type[ast.AST], name: str) -> set[str]:
    """The files of both homes that define (``FunctionDef``), call or name ``name``."""
    files = set()
    for root in (BENCH, BENCHMARKS):
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, predicate):
                    continue
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    hit = node.name == name
                elif isinstance(node, ast.Call):
                    hit = ast.unparse(node.func).split(".")[-1] == name
                else:
                    hit = False
                if hit:
                    files.add(path.name)
    return files


def test_benchmarks_share_the_bench_payloads_servers_and_concurrency() -> None:
    """One way to do each: no second payload generator, server starter or ``bounded``."""
    assert _where(ast.AsyncFunctionDef, "bounded") == {"worker.py"}
    assert _where(ast.AsyncFunctionDef, "_bounded") == set()
    # Every payload is built in workload.py.
    assert _where(ast.Call, "JSONRPCNotification") == {"workload.py"}
    # Server processes start in servers.py; append_instructions.py starts a
    # redis-server under valgrind, which is not a server of the benchmarks.
    assert _where(ast.Call, "Popen") == {"servers.py", "append_instructions.py"}

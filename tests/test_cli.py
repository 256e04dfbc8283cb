"""The ``replaystore`` command: the demo's verdicts, inspect and probe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from replaystore.cli import main
from replaystore.demo import run_demo


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_demo_reaches_every_expected_verdict_on_memory(anyio_backend: str) -> None:
    lines: list[str] = []
    wrong = await run_demo("memory://", out=lines.append)
    text = "\n".join(lines)
    assert wrong == 0, text
    for verdict in (
        "resumed",
        "below_floor",
        "sequence_mismatch",
        "malformed_cursor",
        "ahead_of_high_water",
        "foreign_cursor",
    ):
        assert f"verdict : {verdict}" in text
    assert "replayed: 1 event(s): 4472:tool-7" in text
    assert "silently skips 3121..4400" in text  # the naive store's clamp, computed
    assert text.count("every replica now sees unknown_session") == 5


@pytest.mark.realserver
def test_demo_command_on_real_redis(real_servers: dict[str, object]) -> None:
    from tests.conftest import _server

    handle = _server(real_servers, "redis")  # type: ignore[arg-type]
    out = subprocess.run(
        [sys.executable, "-m", "replaystore", "demo", "--url", handle.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "UNEXPECTED" not in out.stdout
    assert out.stdout.count("verdict : ") == 6


def test_probe_and_inspect_on_an_unknown_session(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "nobody", "--url", "memory://"]) == 1
    assert json.loads(capsys.readouterr().out) == {"session": "nobody", "exists": False}
    assert main(["probe", "nobody", "junk", "--url", "memory://"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "unknown_session"


def test_bad_url_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "S", "--url", "nope://"]) == 2
    assert "no backend for scheme" in capsys.readouterr().err

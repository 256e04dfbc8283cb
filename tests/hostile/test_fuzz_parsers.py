"""A bounded coverage-guided fuzz (atheris) of the cursor parser and the 404-body parser.

The harness is ``fuzz_parsers.py`` beside this file; it runs in a subprocess
because libFuzzer ends the process when it is done. Seeds: a valid cursor and
a valid 404 body, so the fuzzer starts from the interesting shapes.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from replaystore.cursor import Cursor

pytest.importorskip("atheris", reason="atheris has no wheel for this platform")

HARNESS = Path(__file__).with_name("fuzz_parsers.py")


def _with_hint(cursor: Cursor) -> Cursor:
    """The same position with a stream hint, in whatever form the codec has."""
    fields = {f.name for f in dataclasses.fields(Cursor)} - {"epoch", "position", "tag"}
    return dataclasses.replace(cursor, tag="0123456789abcdef", **dict.fromkeys(fields, 7))


RUNS = 20_000


def test_parsers_survive_a_bounded_fuzz(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    body = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32600,
            "message": "Not Found: cannot resume (below_floor)",
            "data": {
                "verdict": "below_floor",
                "evidence": {
                    "session": "s",
                    "reason": "gone",
                    "floor": 3,
                    "tombstone": {"reason": "x", "at": 1.5, "verdict": "foreign_cursor"},
                },
            },
        },
    }
    (corpus / "cursor").write_bytes(b"\x010123456789ab-42")
    hinted = Cursor.parse("0123456789ab-42")
    (corpus / "hinted").write_bytes(b"\x01" + str(_with_hint(hinted)).encode())
    (corpus / "body").write_bytes(b"\x00" + json.dumps(body).encode())
    out = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            f"-runs={RUNS}",
            "-max_len=512",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"#{RUNS}\tDONE" in out.stderr, out.stderr[-2000:]

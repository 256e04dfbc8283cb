"""Coverage-guided fuzzing (atheris) of the two parsers that read what a peer sends.

- ``Cursor.parse``: a ``Last-Event-ID`` is whatever the client (or a proxy)
  puts there. Any input either fails with ``CursorError`` or parses to a
  cursor with exactly one spelling: ``str(cursor)`` is the input, and parsing
  that gives the same cursor.
- ``desync_error``: the body of a 404 is whatever the server (or something in
  front of it) sent. It returns an error carrying a failed verdict, or
  ``None``; it never raises.

Run: ``python tests/hostile/fuzz_parsers.py -runs=50000`` (libFuzzer flags).
Exits non-zero with the crashing input when a property breaks.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["replaystore"]):
    from replaystore.cursor import Cursor, CursorError
    from replaystore.mcp.client.resuming import desync_error


def check_cursor(data: bytes) -> None:
    try:  # the bytes as a header value would arrive: UTF-8, else Latin-1
        text = data.decode()
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    try:
        cursor = Cursor.parse(text)
    except CursorError:
        assert Cursor.try_parse(text) is None
        return
    assert str(cursor) == text, (text, str(cursor))
    assert Cursor.parse(str(cursor)) == cursor
    assert Cursor.try_parse(text) == cursor


def check_desync_body(data: bytes) -> None:
    error = desync_error(data)
    if error is not None:
        assert not error.verdict.ok
        assert isinstance(error.resumption.evidence.as_dict(), dict)


def one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1:
        check_cursor(data[1:])
    else:
        check_desync_body(data[1:])


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

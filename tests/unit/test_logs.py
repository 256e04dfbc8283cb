"""Log records cut to a bounded length while an app runs (``replaystore.mcp.process``)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from replaystore.mcp.process import capping_records


@pytest.fixture(autouse=True)
def _logging_enabled() -> Iterator[None]:
    """Records are written whatever another test of this process disabled (``logging.disable``)."""
    disabled = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    yield
    logging.disable(disabled)


def test_every_handler_writes_bounded_records_while_capping_and_whole_ones_after() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("tests.unit.logs")
    logger.setLevel(logging.INFO)  # whatever level another test left on the root logger
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with capping_records(100):
            logger.warning("tool %s unknown", "n" * 10_000)
            try:
                raise ValueError("v" * 10_000)
            except ValueError:
                logger.exception("failed")
        capped = out.getvalue()
        out.truncate(0)
        out.seek(0)
        logger.warning("tool %s unknown", "n" * 10_000)
        whole = out.getvalue()
    finally:
        logger.removeHandler(handler)
    assert len(capped) < 400, capped
    assert capped.count("characters)") == 2  # the message and the traceback, each said cut
    assert f"... ({len('tool ' + 'n' * 10_000 + ' unknown')} characters)" in capped
    assert len(whole) > 10_000 and not handler.filters


def test_a_limit_below_one_is_refused_and_none_leaves_the_log_alone() -> None:
    with pytest.raises(ValueError, match="at least 1"), capping_records(0):
        pass
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("tests.unit.logs.none")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with capping_records(None):
            logger.warning("%s", "n" * 10_000)
    finally:
        logger.removeHandler(handler)
    assert out.getvalue() == "n" * 10_000 + "\n"

"""The log of a store outage: a few lines per outage, whatever the number of failed calls."""

from __future__ import annotations

import logging

import pytest

from replaystore.backends.outages import OutageLog


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "outage-test"]


def test_one_line_to_begin_one_per_period_and_one_to_end(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    log = OutageLog(logging.getLogger("outage-test"), "storing events", every=30, clock=clock)
    with caplog.at_level(logging.WARNING, logger="outage-test"):
        for _ in range(1000):  # a thousand failed calls within a second
            log.failed("out of memory")
            clock.now += 0.001
        assert log.failing
        assert _lines(caplog) == [
            "storing events failed: out of memory (logged again every 30 s while it fails)"
        ]
        clock.now += 30
        log.failed("out of memory")
        assert _lines(caplog)[-1].startswith(
            "storing events still failing: 1000 failure(s) in the last 31 s"
        )
        log.succeeded()
        assert not log.failing
        assert _lines(caplog)[-1] == "storing events works again after 31.0 s and 1001 failure(s)"
        assert len(_lines(caplog)) == 3


def test_a_flapping_store_gives_a_line_per_period(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    log = OutageLog(logging.getLogger("outage-test"), "storing events", every=30, clock=clock)
    with caplog.at_level(logging.WARNING, logger="outage-test"):
        for _ in range(100):  # fails and recovers every second for 100 s
            log.failed("unreachable")
            assert log.failing
            clock.now += 0.5
            log.succeeded()
            assert not log.failing
            clock.now += 0.5
    assert 2 <= len(_lines(caplog)) <= 2 * (100 // 30 + 1), _lines(caplog)


def test_success_without_a_failure_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    log = OutageLog(logging.getLogger("outage-test"), "storing events")
    with caplog.at_level(logging.WARNING, logger="outage-test"):
        log.succeeded()
    assert _lines(caplog) == []

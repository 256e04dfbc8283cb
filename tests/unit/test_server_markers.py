"""The ``realserver`` marker follows fixture use, whatever directory a test lives in.

Collected in a scratch directory with the servers plugin, nothing run: no
server starts.
"""

from __future__ import annotations

import pytest

TESTS = """
import pytest

@pytest.fixture
def through(redis_server):
    return redis_server

@pytest.fixture(params=["plain", pytest.param("real", marks=pytest.mark.realserver)])
def kind(request):
    return request.param

def test_direct(redis_server): pass
def test_through_a_fixture(through): pass
def test_the_factory(real_servers): pass
def test_scratch(scratch_server): pass
def test_nothing(): pass
def test_case(kind): pass
"""


def test_marked_by_fixture_use_and_run_last(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["tests.plugins.servers"]')
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_anywhere=TESTS)
    items, _ = pytester.inline_genitems()
    marked = {item.name: item.get_closest_marker("realserver") is not None for item in items}
    assert marked == {
        "test_direct": True,
        "test_through_a_fixture": True,
        "test_the_factory": True,
        "test_scratch": True,
        "test_nothing": False,
        "test_case[plain]": False,
        "test_case[real]": True,
    }
    listed = pytester.runpytest_inprocess("--collect-only", "-q").outlines
    order = [marked[line.partition("::")[2]] for line in listed if "::" in line]
    assert len(order) == len(marked)
    assert order == sorted(order), "tests without a real server run first"

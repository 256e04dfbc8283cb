"""The one check behind the MCP SDK's and redis-py's lists of private names."""

from __future__ import annotations

from typing import Any

from replaystore._seams import Requirement, describe, missing


class Upstream:
    attribute = 1

    def method(self, *, flag: bool = False) -> None: ...


def _not_installed() -> Any:
    raise ImportError("No module named 'optional_package'")


def _broken() -> Any:
    raise RuntimeError("cannot be built")


OWNERS = {
    "Upstream": lambda: Upstream,
    "Upstream.method": lambda: Upstream.method,
    "Optional": _not_installed,
    "Broken": _broken,
    "NotCallable": lambda: 42,
}


def test_each_kind_is_found_or_reported_missing() -> None:
    there = [
        Requirement("Upstream", "attribute", "attribute", "why"),
        Requirement("Upstream", "method", "method", "why"),
        Requirement("Upstream.method", "flag", "parameter", "why"),
    ]
    gone = [
        Requirement("Upstream", "gone", "attribute", "why"),
        Requirement("Upstream", "attribute", "method", "an attribute is not a method"),
        Requirement("Upstream.method", "other", "parameter", "why"),
        Requirement("NotCallable", "x", "parameter", "no signature to look in"),
    ]
    assert missing([*there, *gone], OWNERS) == gone


def test_an_owner_that_cannot_be_built_has_none_of_its_names() -> None:
    broken = Requirement("Broken", "x", "attribute", "why")
    assert missing([broken], OWNERS, optional=(ImportError,)) == [broken]


def test_an_optional_package_that_is_not_installed_misses_nothing() -> None:
    optional = Requirement("Optional", "x", "attribute", "why")
    assert missing([optional], OWNERS, optional=(ImportError,)) == []
    assert missing([optional], OWNERS) == [optional]  # required: its absence is reported


def test_what_a_message_names() -> None:
    gone = [Requirement("A", "b", "method", "c"), Requirement("D", "e", "parameter", "f")]
    assert describe(gone) == "A.b (method: c); D.e (parameter: f)"

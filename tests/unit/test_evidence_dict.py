"""``Evidence.as_dict``: error bodies and logs, each field as ``asdict`` has it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from replaystore.verdicts import Evidence, Tombstone, Verdict


def _through_asdict(evidence: Evidence) -> dict[str, Any]:
    """The dict as ``dataclasses.asdict`` spells it, with the documented omissions."""
    out: dict[str, Any] = {}
    for key, value in dataclasses.asdict(evidence).items():
        if value is None or (key == "torn_down" and not value):
            continue
        if key == "tombstone":
            value = {k: (str(v) if k == "verdict" and v else v) for k, v in value.items()}
            value = {k: v for k, v in value.items() if v is not None}
        out[key] = value
    return out


EVIDENCE = [
    Evidence("s", "why"),
    Evidence("s", "why", cursor="c", cursor_epoch="e", cursor_position=0, floor=0, retained=0),
    Evidence(
        "s",
        "why",
        epoch="e",
        floor=1,
        high_water=9,
        retained=3,
        sequence="q",
        sequence_floor=2,
        sequence_high_water=9,
        cursor_sequence="r",
        sequence_count=2,
        replayed=0,
        torn_down=True,
    ),
    Evidence("s", "why", tombstone=Tombstone("closed", 0.0)),
    Evidence("s", "why", tombstone=Tombstone("", 12.5, Verdict.FOREIGN_CURSOR), torn_down=False),
]


@pytest.mark.parametrize("evidence", EVIDENCE)
def test_as_dict_is_asdict_without_what_is_missing(evidence: Evidence) -> None:
    got = evidence.as_dict()
    assert got == _through_asdict(evidence)
    assert list(got) == list(_through_asdict(evidence))  # the fields' order, too
    if evidence.tombstone is not None and evidence.tombstone.verdict is not None:
        assert type(got["tombstone"]["verdict"]) is str

"""``_frozen.builder``: a positional constructor whose objects are the class's own."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from replaystore._frozen import builder
from replaystore.cursor import Cursor, sequence_tag
from replaystore.rules import Chain, Judgement, SequenceState, Stored
from replaystore.verdicts import Evidence, Resumption, Verdict


@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        self.checked.append("post_init")


def test_equal_hash_and_fields_in_order() -> None:
    build = builder(Point)
    built, made = build(1, 2, ["a"], []), Point(1, 2, ["a"])
    assert built == made and type(built) is Point
    assert dataclasses.astuple(built) == (1, 2, ["a"], [])
    assert built.checked == []  # no __post_init__: the caller vouches for the values
    small = builder(Cursor)("0123456789ab", 7, None, None, None)
    assert small == Cursor("0123456789ab", 7) and hash(small) == hash(Cursor("0123456789ab", 7))
    assert [f.name for f in dataclasses.fields(Cursor)] == [
        "epoch",
        "position",
        "tag",
        "ordinal",
        "stamp",
    ]


def test_immutable() -> None:
    built = builder(Point)(1, 2, [], [])
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.x = 3  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        built.z = 3  # type: ignore[attr-defined]  # slots: no other attribute


@pytest.mark.parametrize("args", [(), (1,), (1, 2, [], [], 5)])
def test_wrong_arity_raises_type_error(args: tuple[object, ...]) -> None:
    with pytest.raises(TypeError):
        builder(Point)(*args)


def test_keywords_in_field_names_only() -> None:
    assert builder(Point)(y=2, x=1, tags=[], checked=[]) == Point(1, 2)
    with pytest.raises(TypeError):
        builder(Point)(1, 2, [], [], _cls=int)


def test_only_frozen_slots_dataclasses() -> None:
    @dataclass(slots=True)
    class Loose:
        x: int

    @dataclass(frozen=True)
    class NoSlots:
        x: int

    for cls in (Loose, NoSlots, int):
        with pytest.raises(TypeError):
            builder(cls)


def test_the_classes_built_per_resume() -> None:
    """Each class a resume builds this way gives what its constructor gives."""
    state = ("s", "t" * 16, 5, 1, 0, 3)
    assert builder(SequenceState)(*state) == SequenceState(*state)
    chain = ("s", 1, [2, 3], [b"a", None], ["1", "2"], ["2", "3"])
    assert builder(Chain)(*chain) == Chain(*chain)
    assert builder(Stored)([1], [b"a"], ["1"], None) == Stored([1], [b"a"], ["1"])
    judged = (Verdict.RESUMED, "resumed", "s", Chain(*chain), None)
    assert builder(Judgement)(*judged) == Judgement(*judged)
    evidence = Evidence("S", "why", replayed=2)
    values = [getattr(evidence, f.name) for f in dataclasses.fields(Evidence)]
    assert builder(Evidence)(*values) == evidence
    assert builder(Resumption)(Verdict.RESUMED, evidence, "s", []) == Resumption(
        Verdict.RESUMED, evidence, "s"
    )


def test_evidence_for_fills_every_field_by_name() -> None:
    """``evidence_for`` gives Evidence's fields by position: each lands in the field it names."""
    from replaystore.backends.redis.replies import Facts
    from replaystore.rules import evidence_for, judge

    tag = sequence_tag("seq")
    state = SequenceState("seq", tag, 9, 4, 2, 5)
    facts = Facts("0123456789ab", 9, 3, 6, 2, {tag: state}, None, 0, [])
    cursor = Cursor("0123456789ab", 12)
    judgement = judge(facts, cursor, None)
    evidence = evidence_for("S", "raw", cursor, facts, judgement, torn_down=True, replay=True)
    assert evidence == Evidence(
        session="S",
        reason=judgement.reason,
        cursor="raw",
        cursor_epoch="0123456789ab",
        cursor_position=12,
        epoch="0123456789ab",
        floor=3,
        high_water=9,
        retained=6,
        sequence=None,
        sequence_floor=None,
        sequence_high_water=None,
        cursor_sequence=None,
        sequence_count=2,
        replayed=None,
        torn_down=True,
    )
    named = judge(facts, Cursor("0123456789ab", 0), "seq")
    evidence = evidence_for("S", "r", None, facts, named, torn_down=False, replay=False)
    assert (evidence.sequence, evidence.sequence_floor, evidence.sequence_high_water) == (
        "seq",
        4,
        9,
    )
    assert evidence.cursor_epoch is None and evidence.tombstone is None


def test_a_class_its_twin_cannot_stand_for_is_built_through_its_slots() -> None:
    """A subclass (slots of its own on a base's) is built as the class itself builds it."""

    @dataclass(frozen=True, slots=True)
    class Base:
        x: int

    @dataclass(frozen=True, slots=True)
    class Derived(Base):
        y: int = 0

    built = builder(Derived)(1, 2)
    assert built == Derived(1, 2) and type(built) is Derived
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.y = 3  # type: ignore[misc]


def test_built_objects_are_of_the_class_with_no_twin_left_behind() -> None:
    """The twin a builder stores into is never seen: what it returns is of the class, and
    pickles, copies and compares as one built by the class does."""
    import copy
    import pickle

    built = builder(Point)(1, 2, ["a"], [])
    assert type(built) is Point and isinstance(built, Point)
    assert pickle.loads(pickle.dumps(built)) == built == copy.copy(built) == copy.deepcopy(built)
    assert repr(built) == "Point(x=1, y=2, tags=['a'], checked=[])"

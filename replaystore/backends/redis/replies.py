"""Reply decoding: what Redis returns, as the facts and records the rules read.

The stored forms are drawn in ``docs/data-layout.md``: a sequence's state is
one comma-separated field of the meta hash, an event one list element
``<position>,<stamp>[:<payload>]``. Decoding a replay's elements
(:func:`stored`) is the hot loop of every resume, written to run no Python
code per element.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from ..._frozen import builder
from ...cursor import sequence_tag
from ...info import SessionInfo
from ...rules import Record, SequenceState, Stored
from ...verdicts import Tombstone, Verdict, reason_text
from .scripts import FACT_SLOTS, SLOT

__all__ = [
    "Facts",
    "StoredState",
    "decode_elements",
    "decode_facts",
    "decode_info",
    "decode_record",
    "decode_state",
    "decode_tombstone",
]


@dataclass(frozen=True, slots=True)
class StoredState:
    public: SequenceState
    base: int
    stamp: int  # the high-water event's

    def newest_evicted(self, element: bytes | None) -> Record | None:
        """The sequence's newest evicted event: ``element`` (ordinal ``first - 1``),
        or, when every event is evicted, its high-water event (the state names it)."""
        state = self.public
        if element is not None:
            return decode_record(element, state.name, state.first_ordinal - 1)
        if state.retained == 0 and state.next_ordinal > 0:
            return Record(state.high_water, state.name, state.next_ordinal - 1, None, self.stamp)
        return None


def decode_state(raw: bytes) -> StoredState:
    """``high_water,stamp,floor,first,next,base,priming,name`` (the name may hold commas)."""
    hw, stamp, floor, first, nxt, base, _priming, name = raw.split(b",", 7)
    text = name.decode("utf-8")
    return _new_stored_state(
        _new_sequence_state(text, sequence_tag(text), int(hw), int(floor), int(first), int(nxt)),
        int(base),
        int(stamp),
    )


# Read per resume: built positionally (see ``_frozen``), the stored values proven numbers by int().
_new_stored_state = builder(StoredState)
_new_sequence_state = builder(SequenceState)
_new_stored = builder(Stored)


def decode_record(element: bytes, sequence: str, ordinal: int) -> Record | None:
    """``<position>,<stamp>:<payload>``, ``<position>,<stamp>`` (priming), or empty (lost)."""
    head, colon, payload = element.partition(b":")
    if not _HEAD_RE.fullmatch(head):
        return None
    position, _, stamp = head.partition(b",")
    return Record(int(position), sequence, ordinal, payload if colon else None, int(stamp))


def decode_elements(elements: list[bytes]) -> Stored:
    """Decode list elements into parallel arrays: the replay's hot loop.

    Written as C functions over the whole list, with no Python code run per
    element, and the stamps kept as text: they only go into event ids (as do
    the positions' texts, kept beside them). A list with any element that is
    not ``<position>,<stamp>[:<payload>]`` (a lost one is empty), or with a
    number 0 in a head (never stored by the scripts), takes the slow path,
    element by element.
    """
    if not elements:
        return _new_stored([], [], [], None)
    heads, separators, bodies = zip(*map(bytes.partition, elements, repeat(b":")), strict=True)
    joined = b";".join(heads)
    positions: list[int | None]
    texts: list[str] | None = None
    # Every byte of the heads is a digit but one comma per head (the shape
    # left once the digits are taken out), and no number is empty or starts
    # with a 0 (the smallest text would be "" or start with "0"): every
    # element is well formed, and its numbers are as the scripts write them.
    if joined.translate(None, _DIGITS) + b";" == b",;" * len(heads):
        numbers = joined.decode().replace(";", ",").split(",")
        if min(numbers) >= "1":
            texts = numbers[0::2]
            positions = list(map(int, texts))
            stamps = numbers[1::2]
    if texts is None:  # a lost element (empty) or a damaged one: mark it, the rules see a hole
        positions, stamps, texts = [], [], []
        for head in heads:
            ok = _HEAD_RE.fullmatch(head)
            position, _, stamp = head.partition(b",")
            positions.append(int(position) if ok else None)
            stamps.append(stamp.decode() if ok else "")
            texts.append(position.decode() if ok else "")
        if None in positions:
            texts = None
    if b"" in separators:  # priming events carry no payload
        payloads = [body if sep else None for sep, body in zip(separators, bodies, strict=True)]
        return _new_stored(positions, payloads, stamps, texts)
    return _new_stored(positions, list(bodies), stamps, texts)


#: A position or a stamp as the scripts write them, and as cursors spell them
#: (no sign, no leading zero).
_NUMBER = rb"(?:0|[1-9][0-9]*+)"
_HEAD_RE = re.compile(_NUMBER + b"," + _NUMBER)
_DIGITS = b"0123456789"


@dataclass(slots=True)
class Facts:
    """Facts read from Redis (``replaystore.rules.Facts``)."""

    epoch: str
    top: int
    floor: int
    retained: int
    sequence_count: int
    states: dict[str, SequenceState]
    chain_tag: str | None
    chain_ordinal: int
    elements: list[bytes]
    record_at: Record | None = None
    evicted: Record | None = None  # the chain sequence's newest evicted event, when read

    def sequence(self, name: str) -> SequenceState | None:
        state = self.states.get(sequence_tag(name))
        return state if state is not None and state.name == name else None

    def only_sequence(self) -> str | None:
        state = self.states.get(self.chain_tag or "")
        return state.name if state is not None and self.sequence_count == 1 else None

    def record(self, position: int) -> Record | None:
        at = self.record_at
        return at if at is not None and at.position == position else None

    def last_evicted(self, tag: str) -> Record | None:
        return self.evicted if tag == self.chain_tag else None

    def events_from(self, sequence: str, ordinal: int) -> Stored:
        state = self.sequence(sequence)
        if state is None or state.tag != self.chain_tag or ordinal < self.chain_ordinal:
            return Stored([], [], [])
        skip = ordinal - self.chain_ordinal
        return decode_elements(self.elements[skip:] if skip else self.elements)


def decode_facts(out: list[Any]) -> Facts:
    """Facts from ``facts.lua``'s reply."""

    def slot(name: str) -> Any:
        return out[SLOT[name]]

    states: dict[str, SequenceState] = {}
    chain: StoredState | None = None
    for raw in (slot("named_state"), slot("chain_state")):
        if raw:
            chain = decode_state(raw)
            states[chain.public.tag] = chain.public
    chain_tag = slot("chain_tag").decode() if slot("chain_tag") else None
    evicted = None
    if chain is not None and chain_tag == chain.public.tag:
        evicted = chain.newest_evicted(slot("evicted_element") or None)
    record_at = None
    if slot("record_tag"):
        owner = states.get(slot("record_tag").decode())
        record_at = decode_record(
            slot("record_element"), owner.name if owner else "", int(slot("record_ordinal"))
        )
    return Facts(
        epoch=slot("epoch").decode(),
        top=int(slot("top")),
        floor=int(slot("floor")),
        retained=int(slot("count")),
        sequence_count=int(slot("nseq")),
        states=states,
        chain_tag=chain_tag,
        chain_ordinal=int(slot("chain_ordinal") or 0),
        elements=list(out[len(FACT_SLOTS) :]),
        record_at=record_at,
        evicted=evicted,
    )


def decode_tombstone(raw: bytes | None) -> Tombstone | None:
    if not raw:
        return None
    data = json.loads(raw)
    verdict = data.get("verdict")
    return Tombstone(
        reason=reason_text(data.get("code", "")),
        at=data.get("at", 0) / 1000,
        verdict=Verdict(verdict) if verdict else None,
    )


def decode_info(session: str, meta: list[Any], states: list[bytes]) -> SessionInfo:
    parsed = sorted((decode_state(raw).public for raw in states), key=lambda s: s.floor)
    return SessionInfo(
        session=session,
        epoch=meta[0].decode(),
        floor=int(meta[2]),
        high_water=int(meta[1]),
        retained=int(meta[3]),
        sequences={s.name: s.info() for s in parsed},
    )

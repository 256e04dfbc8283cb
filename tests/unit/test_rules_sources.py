"""The rules live in one place: checked on the sources, mechanically.

* The Lua scripts gather facts and never name a verdict: no verdict value and
  no reason code appears in them. ``facts.lua`` checks a few named conditions
  to tear a session down in the same call; the client maps each to its code,
  and ``tests/backends/redis/test_teardown_rules.py`` compares them with the rules.
* Every (verdict, reason) pair the Python rules can produce is a pair the
  reason table knows, with that verdict; so is every verdict ``replaystore.mcp``
  reaches on its own.
* The slots of ``facts.lua``'s reply are named once (``FACT_SLOTS``): every
  ``SLOT.<name>`` the scripts use is one of them, and each is used.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import replaystore.mcp as mcp
import replaystore.rules as rules
from replaystore import Verdict
from replaystore.backends.redis.scripts import FACT_SLOTS, SCRIPTS
from replaystore.verdicts import REASONS

LUA = {
    path.name: path.read_text()
    for path in Path(str(resources.files("replaystore.backends.redis") / "lua")).glob("*.lua")
}


def test_lua_scripts_decide_no_verdict() -> None:
    assert LUA, "no Lua sources found"
    words = {v.value for v in Verdict} | (set(REASONS) - {"closed"})
    for name, source in LUA.items():
        literals = set(re.findall(r"'([a-z_]+)'", source)) | set(re.findall(r'"([a-z_]+)"', source))
        assert not (literals & words), (name, literals & words)


def test_every_pair_the_rules_produce_is_known() -> None:
    source = Path(rules.__file__).read_text()
    pairs = re.findall(r"Verdict\.([A-Z_]+),\s*\"([a-z_]+)\"", source)
    assert len(pairs) >= 14, pairs
    for verdict, code in pairs:
        assert code in REASONS, code
        assert REASONS[code][0] is Verdict[verdict], (verdict, code)
    # every reason a judgement can carry is used somewhere (no stale table entries)
    used = (
        {code for _, code in pairs}
        | set(_mcp_reasons())
        | {
            "no_session",
            "closed",
            "torn_down",
            "invalid_session",
            "index_lost",
            "store_regressed",
            "store_restored",
        }
    )
    assert used == set(REASONS)


def _mcp_reasons() -> dict[str, Verdict]:
    """The reason codes replaystore.mcp gives its own verdicts, with the verdict of each.

    An ``Evidence`` built there names its reason by code (``reason_text("code")``)
    or by the very text of a table entry; any other text fails here.
    """
    found: dict[str, Verdict] = {}
    texts = {text: code for code, (_, text) in REASONS.items()}
    pattern = re.compile(
        r"Verdict\.([A-Z_]+),\s*Evidence\(\s*[\w.]+(?:\([^()]*\))?,\s*"
        r'(?:reason_text\("([a-z_]+)"\)|"([^"]*)")'
    )
    for path in Path(mcp.__file__).parent.rglob("*.py"):
        source = path.read_text()
        built = len(re.findall(r"\bEvidence\((?!\*\*)", source))
        matches = pattern.findall(source)
        assert len(matches) == built, (path.name, "an Evidence whose reason is not in the table")
        for verdict, code, text in matches:
            code = code or texts.get(text, "")
            assert code in REASONS, (path.name, text)
            assert REASONS[code][0] is Verdict[verdict], (path.name, verdict, code)
            found[code] = Verdict[verdict]
    return found


def test_mcp_reasons_are_in_the_table() -> None:
    assert set(_mcp_reasons()) == {"attached_live", "vanished", "no_session"}


def test_fact_slots_named_once() -> None:
    used = set(re.findall(r"SLOT\.([a-z][a-z_]*)", LUA["facts.lua"]))
    assert used <= set(FACT_SLOTS), used - set(FACT_SLOTS)
    assert used == set(FACT_SLOTS)
    assert "local SLOT = {" in SCRIPTS["facts"].source
    assert len(FACT_SLOTS) == len(set(FACT_SLOTS))

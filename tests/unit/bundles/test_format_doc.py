"""docs/bundle-format.md and the code agree: every rule names real reason codes and has tests."""

from __future__ import annotations

import re
from pathlib import Path

from nodeagent import errors

ROOT = Path(__file__).resolve().parents[3]
RULE_ROW = re.compile(r"^\| (R\d+) \| (.+) \| (.+) \|$", re.MULTILINE)


def rules() -> dict[str, str]:
    text = (ROOT / "docs" / "bundle-format.md").read_text()
    return {rule: codes for rule, _, codes in RULE_ROW.findall(text)}


def test_rules_are_numbered_in_order() -> None:
    found = list(rules())
    assert found == [f"R{n}" for n in range(1, len(found) + 1)]
    assert len(found) >= 25


def test_every_reason_code_a_rule_names_exists() -> None:
    known = {
        cls.reason
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.NodeAgentError)
    }
    named = {code for codes in rules().values() for code in re.findall(r"`(\w+)`", codes)}
    assert named - known == set()
    assert {"BundleSignatureLegacy", "BundleSetInvalid", "BundleArchitectureMismatch"} <= named


def test_every_rule_has_a_unit_test() -> None:
    """A test whose name or parameter id starts with the rule's number (``R6-``, ``_R6_``)."""
    sources = "\n".join(p.read_text() for p in (ROOT / "tests" / "unit").rglob("test_*.py"))
    missing = [
        rule for rule in rules() if not re.search(rf"(id=\"{rule}-|def test_{rule}_)", sources)
    ]
    assert missing == []

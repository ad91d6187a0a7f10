"""The marks file kept beside the store's signed manifests (``nodeagent.bundles.rollback_marks``):
what it keeps, and that it reads back only what nodeagent writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodeagent.bundles.freshness import Stamp, judge
from nodeagent.bundles.rollback_marks import compact, marks_from_json, marks_to_json
from nodeagent.errors import StateFileDamaged


def stamp(key: str, sequence: int, **changes: Any) -> Stamp:
    fields: dict[str, Any] = {"format_version": 3, "supersedes": ()} | changes
    channel = fields.pop("channel", "default")
    digest = fields.pop("digest", "a")
    return Stamp(key, channel, sequence, f"sha256:{digest * 64}", f"{key}-{sequence}", **fields)


MANY = [
    stamp("A1", 1, format_version=1),
    stamp("A1", 5),
    stamp("A1", 5, digest="b"),
    stamp("A1", 3, channel="apps"),
    stamp("B2", 7, supersedes=("A1",)),
    stamp("B2", 9),
]


def test_compact_keeps_what_the_rule_needs() -> None:
    kept = compact(MANY)
    assert stamp("A1", 1, format_version=1) not in kept
    assert {(s.key_id, s.channel, s.sequence) for s in kept} == {
        ("A1", "default", 5), ("A1", "apps", 3), ("B2", "default", 7), ("B2", "default", 9),
    }  # fmt: skip
    assert len([s for s in kept if s.sequence == 5]) == 2, "both manifests at the mark"


@pytest.mark.parametrize("candidate", [stamp("A1", 4, digest="c"), stamp("A1", 6, digest="c"),
                                       stamp("B2", 8, digest="c"), stamp("A1", 2, format_version=2,
                                       digest="c"), stamp("A1", 5, digest="b")])  # fmt: skip
def test_judging_against_the_compacted_marks_is_judging_against_all(candidate: Stamp) -> None:
    assert judge(candidate, compact(MANY)) == judge(candidate, MANY)


def test_round_trip_and_stable_bytes() -> None:
    data = marks_to_json(MANY)
    assert marks_to_json(reversed(MANY)) == data
    assert set(marks_from_json(data, where="m")) == set(compact(MANY))


def good_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(marks_to_json(MANY))
    return doc


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d.update(version=2), "not a version 1 marks file"),
        (lambda d: d.update(stamps={}), "stamps must be a list"),
        (lambda d: d["stamps"][0].update(extra=1), "must hold exactly"),
        (lambda d: d["stamps"][0].update(keyId="a1"), "keyId"),
        (lambda d: d["stamps"][0].update(sequence=-1), "sequence"),
        (lambda d: d["stamps"][0].update(sequence=True), "sequence"),
        (lambda d: d["stamps"][0].update(formatVersion=4), "formatVersion"),
        (lambda d: d["stamps"][0].update(manifestDigest="sha256:x"), "manifestDigest"),
        (lambda d: d["stamps"][0].update(channel="a b"), "channel"),
        (lambda d: d["stamps"][0].update(bundleId="\x1b[2J"), "bundleId"),
        (lambda d: d["stamps"][0].update(supersedes=["a"]), "not a key id"),
    ],
)
def test_a_file_nodeagent_did_not_write_is_damaged(change: Any, needle: str) -> None:
    doc = good_doc()
    change(doc)
    with pytest.raises(StateFileDamaged, match=needle) as raised:
        marks_from_json(json.dumps(doc).encode(), where="m")
    assert "\x1b" not in raised.value.message


def test_not_json_is_damaged() -> None:
    with pytest.raises(StateFileDamaged):
        marks_from_json(b'{"version": 1, "version": 1}', where="m")

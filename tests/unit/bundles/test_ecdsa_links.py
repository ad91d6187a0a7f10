"""The pure parts of the ECDSA signature's wiring (decision 0075): the tree allows
``bundle.json.ecdsa-sig``; a manifest may not list it; a bundle signed with both schemes
links both keys in its stamp, so the anti-rollback rule follows either; the marks file
keeps such a link beside eight declared ones."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.bundles import manifest as bundle
from nodeagent.bundles import tree_rules
from nodeagent.bundles.freshness import MAX_SUPERSEDED, Stamp, judge, with_links
from nodeagent.bundles.rollback_marks import marks_from_json, marks_to_json
from nodeagent.bundles.tree_rules import TreeEntry
from tests.unit.bundles.test_manifest import good_tree, manifest_doc, parse


def stamp(key: str, sequence: int, **changes: Any) -> Stamp:
    digest = changes.pop("digest", "a")
    return Stamp(key, "default", sequence, f"sha256:{digest * 64}", f"{key}-{sequence}", **changes)


def test_the_tree_may_carry_the_ecdsa_signature_but_the_manifest_may_not_list_it() -> None:
    tree = [*good_tree(), TreeEntry(bundle.ECDSA_SIGNATURE_NAME, "file", 400)]
    tree_rules.check_tree(tree, parse(manifest_doc()))
    without_minisign = [e for e in tree if e.path != bundle.SIGNATURE_NAME]
    tree_rules.check_tree(without_minisign, parse(manifest_doc()))
    with pytest.raises(bundle.BundleError) as info:  # a directory of that name
        tree_rules.check_tree([*good_tree(), TreeEntry(bundle.ECDSA_SIGNATURE_NAME, "dir")],
                              parse(manifest_doc()))  # fmt: skip
    assert info.value.reason == "BundleUnlistedFile"
    listed = {"path": bundle.ECDSA_SIGNATURE_NAME, "sha256": "c" * 64, "sizeBytes": 1}
    doc = manifest_doc()
    with pytest.raises(bundle.BundleManifestInvalid, match="listed twice"):
        parse(doc | {"files": [*doc["files"], listed]})


def test_with_links_adds_the_other_key_once_and_never_the_key_itself() -> None:
    assert with_links(("B",), "A", ()) == ("B",)
    assert with_links(("C", "B"), "A", ("D",)) == ("B", "C", "D")
    assert with_links((), "A", ("A",)) == ()


def test_R44_a_linked_stamp_holds_the_mark_for_either_key() -> None:
    """Accepted: bundle 5 signed by minisign key M and ECDSA key E (stamped under M, linked
    to E). Bundle 3 signed by E alone (its minisign signature stripped) is a rollback; so is
    bundle 3 signed by both after an E-only bundle 5 (the candidate's own link)."""
    accepted = [stamp("M", 5, supersedes=with_links((), "M", ("E",)))]
    assert judge(stamp("E", 3, digest="b"), accepted).verdict == "rollback"
    assert judge(stamp("E", 6, digest="b"), accepted).verdict == "fresh"
    unlinked = [stamp("M", 5)]  # without the link, E would be a line of its own
    assert judge(stamp("E", 3, digest="b"), unlinked).verdict == "fresh"
    only_e = [stamp("E", 5)]
    candidate = stamp("M", 3, digest="b", supersedes=with_links((), "M", ("E",)))
    assert judge(candidate, only_e).verdict == "rollback"


def test_the_marks_file_keeps_a_link_beside_eight_declared_keys() -> None:
    declared = tuple(f"{n:X}" for n in range(1, MAX_SUPERSEDED + 1))
    full = stamp("A", 1, format_version=3, supersedes=with_links(declared, "A", ("E0",)))
    assert len(full.supersedes) == MAX_SUPERSEDED + 1
    assert marks_from_json(marks_to_json([full]), where="marks") == (full,)

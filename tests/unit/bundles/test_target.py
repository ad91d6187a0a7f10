"""A bundle's target in ``bundle.json`` (docs/bundle-format.md, rules R29 and R30).

Test ids name the rule they prove, as in test_manifest.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodeagent.bundles import manifest as bundle
from nodeagent.bundles.target import (
    BundleTarget,
    canonical_selector,
    check_node_in_target,
    describe_target,
    parse_selector_text,
    target_miss,
)
from nodeagent.errors import BundleManifestInvalid, BundleNotInTarget
from nodeagent.selectors import parse_selector
from tests.unit.bundles.test_manifest import manifest_doc


def parse(**changes: Any) -> bundle.BundleManifest:
    return bundle.parse_manifest(json.dumps(manifest_doc(**changes)).encode())


def targeted(selector: Any, **changes: Any) -> bundle.BundleManifest:
    return parse(formatVersion=2, target={"nodeSelector": selector}, **changes)


# ---------------------------------------------------------------- parsing (R29)
@pytest.mark.parametrize(
    ("selector", "canonical"),
    [
        pytest.param("site=line-3", "site=line-3", id="R29-equals"),
        pytest.param(
            "site=line-3, node-role.kubernetes.io/worker",
            "node-role.kubernetes.io/worker,site=line-3",
            id="R29-sorted",
        ),
        pytest.param("zone in (b,a),!legacy", "!legacy,zone in (a,b)", id="R29-set"),
        pytest.param("a,a", "a", id="R29-once"),
        pytest.param("tier!=test", "tier!=test", id="R29-not-equal"),
    ],
)
def test_a_target_is_read_and_written_the_one_canonical_way(selector: str, canonical: str) -> None:
    found = targeted(selector)
    assert found.target is not None
    assert found.target.selector_text == canonical
    assert parse_selector_text(canonical, "x") == parse_selector_text(canonical, "x")
    again = targeted(canonical).target
    assert again is not None and again.selector_text == canonical


def test_a_bundle_without_target_reads_as_before_in_either_version() -> None:
    assert parse().target is None
    assert parse(formatVersion=2).target is None


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        pytest.param({"target": {"nodeSelector": "a"}}, "needs formatVersion 2", id="R29-v1"),
        pytest.param({"formatVersion": 2, "target": "a"}, "must be an object", id="R29-text"),
        pytest.param({"formatVersion": 2, "target": None}, "must be an object", id="R29-null"),
        pytest.param({"formatVersion": 2, "target": {}}, "must be a string", id="R29-no-sel"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": ["a"]}}, "must be a string",
                     id="R29-list"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": ""}}, "empty",
                     id="R29-empty"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": "a", "arch": "amd64"}},
                     "unknown key 'arch'", id="R29-unknown-key"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": "a=(b"}}, "not a label",
                     id="R29-syntax"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": "a" * 5000}},
                     "at most 4096", id="R29-long"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": "k=" + "v" * 64}},
                     "not a label value", id="R29-value-64"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": "k" * 64}},
                     "at most 63", id="R29-name-64"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": "a" * 254 + "/k"}},
                     "at most 253", id="R29-prefix-254"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": ",".join(
            f"k{i}" for i in range(65))}}, "at most 64", id="R29-many"),
        pytest.param({"formatVersion": 2, "target": {"nodeSelector": "\x1b[2J=x" * 10}},
                     "\\x1b", id="R29-escaped"),
    ],
)  # fmt: skip
def test_a_malformed_target_is_refused(changes: dict[str, Any], needle: str) -> None:
    with pytest.raises(BundleManifestInvalid) as info:
        parse(**changes)
    assert needle in info.value.message
    assert "\x1b" not in info.value.message
    assert len(info.value.message) < 600


def test_a_unicode_key_never_reaches_a_message_raw() -> None:
    with pytest.raises(BundleManifestInvalid) as info:
        parse(formatVersion=2, target={"nodeSelector": "\u202ekey=x"})
    assert "\u202e" not in info.value.message


# ---------------------------------------------------------------- the rule (R30)
TARGET = BundleTarget(parse_selector("site=line-3,!legacy"))


@pytest.mark.parametrize(
    ("architecture", "target", "labels", "node_architecture", "miss"),
    [
        pytest.param("amd64", None, None, "amd64", None, id="R30-no-target-no-labels"),
        pytest.param("amd64", None, {"a": "b"}, "amd64", None, id="R30-no-target"),
        pytest.param("amd64", None, None, "arm64", "architecture", id="R30-arch"),
        pytest.param("amd64", TARGET, {"site": "line-3"}, "amd64", None, id="R30-match"),
        pytest.param("amd64", TARGET, {"site": "line-4"}, "amd64", "selector", id="R30-other"),
        pytest.param("amd64", TARGET, {"site": "line-3", "legacy": ""}, "amd64", "selector",
                     id="R30-not"),
        pytest.param("amd64", TARGET, {}, "amd64", "selector", id="R30-no-labels-set"),
        pytest.param("amd64", TARGET, None, "amd64", "selector", id="R30-labels-unknown"),
        pytest.param("arm64", TARGET, {"site": "line-3"}, "amd64", "architecture",
                     id="R30-arch-first"),
    ],
)  # fmt: skip
def test_target_miss(
    architecture: str,
    target: BundleTarget | None,
    labels: dict[str, str] | None,
    node_architecture: str,
    miss: str | None,
) -> None:
    found = target_miss(
        architecture, target, node_labels=labels, node_architecture=node_architecture
    )
    assert found == miss


def test_the_stick_rule_refuses_with_what_to_do() -> None:
    check_node_in_target(None, None, bundle_id="b")
    check_node_in_target(TARGET, {"site": "line-3"}, bundle_id="b")
    with pytest.raises(BundleNotInTarget) as unknown:
        check_node_in_target(TARGET, None, bundle_id="b")
    assert "not known" in unknown.value.message
    assert "--ignore-target" in unknown.value.message
    with pytest.raises(BundleNotInTarget) as other:
        check_node_in_target(TARGET, {"site": "x"}, bundle_id="b\x1b[2J")
    assert "do not match" in other.value.message
    assert "'!legacy,site=line-3'" in other.value.message
    assert "\x1b" not in other.value.message
    assert other.value.reason == "BundleNotInTarget"


def test_canonical_and_described() -> None:
    assert canonical_selector(parse_selector("")) == ""
    assert describe_target("amd64", None) == "every amd64 node"
    assert describe_target("arm64", TARGET) == "arm64 nodes matching '!legacy,site=line-3'"

"""Whether a node follows a bundle it sees on a peer (``nodeagent.site.follow``), as a table."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from nodeagent.bundles import manifest as bundle
from nodeagent.site.follow import (
    FOLLOW,
    SKIP_REASONS,
    FollowSetting,
    NodeFacts,
    decide,
    is_follow_on,
)
from tests.unit.bundles.test_manifest import manifest_doc

DIGEST = "sha256:" + "d" * 64
OTHER_DIGEST = "sha256:" + "e" * 64
BUNDLE_ID = "line-3.2026-11-22"
WORKER = {"node-role.kubernetes.io/worker": "", "site": "line-3"}


def manifest(selector: str | None = None, architecture: str = "amd64") -> bundle.BundleManifest:
    changes: dict[str, Any] = {"architecture": architecture}
    if selector is not None:
        changes |= {"formatVersion": 2, "target": {"nodeSelector": selector}}
    return bundle.parse_manifest(json.dumps(manifest_doc(**changes)).encode())


NODE = NodeFacts(
    follow="auto",
    is_cluster_mode=True,
    has_peers=False,
    architecture="amd64",
    labels=WORKER,
    held={},
)


@pytest.mark.parametrize(
    ("follow", "is_cluster_mode", "has_peers", "is_on"),
    [
        ("on", False, False, True),
        ("off", True, True, False),
        ("auto", True, False, True),
        ("auto", False, True, True),
        ("auto", False, False, False),
    ],
)
def test_the_follow_setting(
    follow: FollowSetting, is_cluster_mode: bool, has_peers: bool, is_on: bool
) -> None:
    assert is_follow_on(follow, is_cluster_mode=is_cluster_mode, has_peers=has_peers) is is_on
    node = replace(NODE, follow=follow, is_cluster_mode=is_cluster_mode, has_peers=has_peers)
    decision = decide(manifest(), DIGEST, node)
    assert decision.is_following is is_on
    assert decision.reason == (None if is_on else "FollowOff")


CASES: list[Any] = [
    # (selector, bundle arch, node changes, reason, part)
    pytest.param(None, "amd64", {}, None, None, id="no-target"),
    pytest.param(None, "amd64", {"labels": None}, None, None, id="no-target-no-api"),
    pytest.param("site=line-3", "amd64", {}, None, None, id="selected"),
    pytest.param("node-role.kubernetes.io/worker,site=line-3", "amd64", {}, None, None,
                 id="selected-by-two"),
    pytest.param("site=line-4", "amd64", {}, "NotInTarget", "selector", id="other-site"),
    pytest.param("site=line-3", "amd64", {"labels": None}, "NotInTarget", "selector",
                 id="labels-unknown"),
    pytest.param("site=line-3", "amd64", {"labels": {}}, "NotInTarget", "selector",
                 id="no-labels"),
    pytest.param("!node-role.kubernetes.io/worker", "amd64", {}, "NotInTarget", "selector",
                 id="not-workers"),
    pytest.param(None, "arm64", {}, "NotInTarget", "architecture", id="other-arch"),
    pytest.param("site=line-3", "arm64", {"labels": None}, "NotInTarget", "architecture",
                 id="arch-before-selector"),
    pytest.param(None, "amd64", {"held": {BUNDLE_ID: DIGEST}}, "AlreadyHeld", None,
                 id="held"),
    pytest.param(None, "amd64", {"held": {BUNDLE_ID: OTHER_DIGEST}}, "DifferentManifestHeld",
                 None, id="conflict"),
    pytest.param(None, "amd64", {"held": {"another": OTHER_DIGEST}}, None, None,
                 id="other-bundle-held"),
    pytest.param("site=line-4", "amd64", {"held": {BUNDLE_ID: OTHER_DIGEST}}, "NotInTarget",
                 "selector", id="target-before-held"),
    pytest.param(None, "amd64", {"follow": "off", "held": {BUNDLE_ID: OTHER_DIGEST}},
                 "FollowOff", None, id="off-before-all"),
]  # fmt: skip


@pytest.mark.parametrize(("selector", "architecture", "changes", "reason", "part"), CASES)
def test_decide(
    selector: str | None,
    architecture: str,
    changes: dict[str, Any],
    reason: str | None,
    part: str | None,
) -> None:
    decision = decide(manifest(selector, architecture), DIGEST, replace(NODE, **changes))
    assert (decision.reason, decision.part) == (reason, part)
    assert decision.is_following is (reason is None)
    if reason is None:
        assert decision == FOLLOW
    else:
        assert reason in SKIP_REASONS
        assert BUNDLE_ID in decision.message


def test_messages_say_why() -> None:
    conflict = decide(manifest(), DIGEST, replace(NODE, held={BUNDLE_ID: OTHER_DIGEST}))
    assert "another signed manifest" in conflict.message
    assert "nothing is replaced" in conflict.message
    unknown = decide(manifest("site=line-3"), DIGEST, replace(NODE, labels=None))
    assert "not known" in unknown.message
    arch = decide(manifest(None, "arm64"), DIGEST, NODE)
    assert "every arm64 node; this node is amd64" in arch.message

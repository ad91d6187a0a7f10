"""Whether a node follows a bundle it sees on a peer (``nodeagent.site.follow``), as a table."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from nodeagent.bundles import manifest as bundle
from nodeagent.bundles.freshness import Stamp
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


# ---------------------------------------------------------------- anti-rollback, expiry
KEY = "A1B2C3"
CREATED_S = 1795339800  # manifest_doc's created, 2026-11-22T09:30:00Z: its sequence


def held_stamp(
    sequence: int, channel: str = "default", key: str = KEY, format_version: int = 3
) -> Stamp:
    return Stamp(key, channel, sequence, OTHER_DIGEST, "newer", format_version=format_version)


def fresh_manifest(sequence: int, expires: str | None = None) -> bundle.BundleManifest:
    changes: dict[str, Any] = {"formatVersion": 3, "sequence": sequence}
    changes |= {"expires": expires} if expires else {}
    return bundle.parse_manifest(json.dumps(manifest_doc(**changes)).encode())


@pytest.mark.parametrize(
    ("accepted", "sequence", "reason"),
    [
        pytest.param((), 3, None, id="nothing-accepted"),
        pytest.param((held_stamp(5),), 3, "Rollback", id="older"),
        pytest.param((held_stamp(5),), 5, "Rollback", id="same-sequence-other-manifest"),
        pytest.param((held_stamp(5),), 6, None, id="newer"),
        pytest.param((held_stamp(5, channel="apps"),), 3, None, id="other-channel"),
        pytest.param((held_stamp(5, key="FFFF"),), 3, None, id="other-key"),
    ],
)
def test_a_bundle_the_import_would_refuse_as_older_is_not_fetched(
    accepted: tuple[Stamp, ...], sequence: int, reason: str | None
) -> None:
    node = replace(NODE, accepted=accepted)
    decision = decide(fresh_manifest(sequence), DIGEST, node, KEY)
    assert decision.reason == reason
    if reason is not None:
        assert reason in SKIP_REASONS
        assert f"sequence {sequence}" in decision.message and "newer" in decision.message


def test_an_older_format_bundle_is_judged_by_its_created_time() -> None:
    def held(sequence: int) -> NodeFacts:
        return replace(NODE, accepted=(held_stamp(sequence, format_version=1),))

    assert decide(manifest(), DIGEST, held(CREATED_S + 1), KEY).reason == "Rollback"
    assert decide(manifest(), DIGEST, held(CREATED_S), KEY).reason == "Rollback"
    assert decide(manifest(), DIGEST, held(CREATED_S - 1), KEY).reason is None


def test_an_older_format_bundle_after_a_newer_format_of_its_key_is_not_fetched() -> None:
    node = replace(NODE, accepted=(held_stamp(5),))  # format 3, a far lower sequence
    decision = decide(manifest(), DIGEST, node, KEY)  # format 1: sequence = its created second
    assert decision.reason == "Rollback"
    assert "format 1, older than" in decision.message


def test_an_expired_bundle_is_not_fetched() -> None:
    expired = fresh_manifest(9, "2026-11-01T00:00:00Z")
    now_s = 1795339800.0  # 2026-11-22
    decision = decide(expired, DIGEST, replace(NODE, now_s=now_s), KEY)
    assert decision.reason == "Expired" and "2026-11-01T00:00:00Z" in decision.message
    assert decide(expired, DIGEST, replace(NODE, now_s=1761955200.0 - 1), KEY) == FOLLOW


def test_held_comes_before_freshness() -> None:
    """A node that holds the very manifest reports it held, not rolled back."""
    node = replace(NODE, held={BUNDLE_ID: DIGEST}, accepted=(held_stamp(9),))
    assert decide(fresh_manifest(3), DIGEST, node, KEY).reason == "AlreadyHeld"

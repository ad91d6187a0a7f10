"""The set ``nodeagent-self`` (decision 0074): the bundle holding the image nodeagent runs is
kept as pinned by it, whatever else is pinned, and nobody else may name a set so."""

from __future__ import annotations

import pytest

from nodeagent.bundles.manifest import BundleSetInvalid, _set
from nodeagent.errors import SpecInvalid
from nodeagent.specs import SELF_SET, is_kept_always, parse_set_object
from nodeagent.store.keeping import KeepRules, decide, referenced
from nodeagent.store.layout import BlobRef, BundleRecord, StoredImage

AGENT = "sha256:" + "a" * 64
APP = "sha256:" + "c" * 64
RULES = KeepRules(gc_grace_s=600.0, keep_newest_per_channel=False)
NOW = 10_000.0


def record(bundle_id: str, image: str, sets: tuple[str, ...] = ("line-3",)) -> BundleRecord:
    stored = StoredImage(f"registry.example/x@{image}", image, 500, "application/json")
    blob = BlobRef(image, 500)
    return BundleRecord(bundle_id, "AA", "", "default", "2026-01-01T00:00:00Z", 0.0, sets,
                        (stored,), (blob,))  # fmt: skip


def test_the_running_agents_bundle_is_kept_by_nodeagent_self() -> None:
    records = [record("agent", AGENT), record("apps", APP)]
    verdicts = decide(
        records, pinned_sets=set(), rules=RULES, now_s=NOW, self_digests=frozenset({AGENT})
    )
    agent, apps = verdicts
    assert agent.is_kept and agent.reasons == ("pinned",)
    assert agent.pinned_sets == (SELF_SET,)
    assert "set nodeagent-self pinned" in agent.describe()
    assert not apps.is_kept
    assert AGENT in referenced(verdicts) and APP not in referenced(verdicts)


def test_without_a_running_image_nothing_is_kept_for_it() -> None:
    """The RPM: no image of its own, no set nodeagent-self."""
    (verdict,) = decide([record("agent", AGENT)], set(), RULES, NOW)
    assert not verdict.is_kept


def test_it_is_kept_beside_the_bundles_own_pinned_set() -> None:
    (verdict,) = decide([record("agent", AGENT)], {"line-3"}, RULES, NOW, frozenset({AGENT}))
    assert verdict.pinned_sets == ("line-3", SELF_SET)


def test_nothing_unpins_or_retires_it() -> None:
    assert is_kept_always(SELF_SET)
    assert not is_kept_always("line-3")


def set_object(name: str) -> dict[str, object]:
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "PinnedImageSet",
        "metadata": {"name": name},
        "spec": {"pinnedImages": [{"name": f"registry.example/x@{APP}"}]},
    }


def test_a_spec_file_may_not_pose_as_nodeagents_own_set() -> None:
    with pytest.raises(SpecInvalid, match="nodeagent's own set"):
        parse_set_object(set_object(SELF_SET), source="x.yaml", is_persistent=True)


def test_a_bundle_may_not_pose_as_nodeagents_own_set() -> None:
    with pytest.raises(BundleSetInvalid, match="nodeagent's own set"):
        _set({"persistent": True, "object": set_object(SELF_SET)}, "bundle.json")

"""``status.releases`` and the release rows: held when imported, pinned when the set is."""

from __future__ import annotations

from nodeagent.cluster.objects import NodeIdentity, status_object
from nodeagent.releases import MAX_RELEASES, pinned_digests, release_rows, releases_json
from nodeagent.status import BundleReport, NodeStatus, PullProgress, ReleaseReport, SetStatus

OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64


def set_status(name: str, state: str) -> SetStatus:
    return SetStatus(name, "bundle", True, state, 1, 1 if state == "Pinned" else None,  # type: ignore[arg-type]
                     None, None, 2, 2, 2 if state == "Pinned" else 0)  # fmt: skip


def bundle(release: ReleaseReport, state: str = "imported") -> BundleReport:
    return BundleReport("/dev/sdb1", state, f"b-{release.version}", release=release)  # type: ignore[arg-type]


def node(*bundles: BundleReport, sets: tuple[SetStatus, ...] = ()) -> NodeStatus:
    return NodeStatus(sets=sets, conditions=(), bundles=bundles)


def test_a_release_is_pinned_once_its_set_is() -> None:
    status = node(
        bundle(ReleaseReport("4.16.3", OLD, "release-4.16.3")),
        bundle(
            ReleaseReport(
                "4.16.5", NEW, "release-4.16.5", "ReleaseNotAnUpgrade", "x\x1b[31m", "4.16.1"
            )
        ),
        bundle(ReleaseReport("4.16.9", "sha256:" + "c" * 64, "release-4.16.9"), "rejected"),
        sets=(set_status("release-4.16.3", "Pinned"), set_status("release-4.16.5", "Progressing")),
    )
    rows = release_rows(status)
    assert [(r.version, r.is_pinned) for r in rows] == [("4.16.3", True), ("4.16.5", False)]
    assert pinned_digests(status) == {OLD}
    assert pinned_digests(None) == frozenset()
    doc = releases_json(rows)
    assert doc[0] == {"digest": OLD, "version": "4.16.3", "set": "release-4.16.3", "pinned": True}
    assert doc[1]["reason"] == "ReleaseNotAnUpgrade"
    assert doc[1]["message"].isprintable()
    body = status_object(
        NodeIdentity("edge-1", ""), status, PullProgress(), placement=None,
        previous_conditions=[], now="now", agent_version="t",
    )  # fmt: skip
    assert body["status"]["releases"] == doc


def test_the_releases_are_bounded_and_a_node_without_any_lists_none() -> None:
    many = [
        bundle(ReleaseReport(f"4.16.{i}", "sha256:" + f"{i:064x}", f"release-4.16.{i}"))
        for i in range(MAX_RELEASES + 5)
    ]
    assert len(release_rows(node(*many))) == MAX_RELEASES
    body = status_object(
        NodeIdentity("edge-1", ""), node(), PullProgress(), placement=None,
        previous_conditions=[], now="now", agent_version="t",
    )  # fmt: skip
    assert "releases" not in body["status"]

"""``ClusterVersionWatch``: what the node asks of ClusterVersion, and what it says once."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import structlog

from nodeagent.cluster.tasks import Connection
from nodeagent.cluster.version_watch import ClusterVersionWatch

NEW = "sha256:" + "b" * 64
OLD = "sha256:" + "a" * 64
REPO = "quay.io/openshift-release-dev/ocp-release"


def cluster_version(target: str | None = None, version: Any = "4.16.3") -> dict[str, Any]:
    spec: dict[str, Any] = {"clusterID": "x"}
    if target:
        spec["desiredUpdate"] = {"image": f"{REPO}@{target}", "version": "4.16.5"}
    entry = {"state": "Completed", "version": version, "image": f"{REPO}@{OLD}",
             "startedTime": "2026-11-01T10:00:00Z", "completionTime": "2026-11-01T11:00:00Z",
             "verified": True}  # fmt: skip
    return {"metadata": {"name": "version"}, "spec": spec, "status": {"history": [entry]}}


def watch(pinned: set[str]) -> ClusterVersionWatch:
    return ClusterVersionWatch(None, Connection("https://api"), lambda: pinned)  # type: ignore[arg-type]


def events(logs: list[MutableMapping[str, Any]]) -> list[str]:
    return [e["event"] for e in logs]


def test_the_version_is_known_only_from_a_usable_object() -> None:
    seen = watch(set())
    assert seen.current_version() is None  # not listed yet
    seen.observe(cluster_version())
    assert seen.current_version() == "4.16.3"
    with structlog.testing.capture_logs() as logs:
        seen.observe(cluster_version(version="4.16"))
        seen.observe(cluster_version(version="4.16"))  # said once
    assert seen.current_version() is None  # nothing guessed from an odd object
    assert events(logs) == ["cluster_version_invalid"]
    assert logs[0]["reason"] == "ReleaseVersionInvalid"
    with structlog.testing.capture_logs() as logs:
        seen.observe(cluster_version())
    assert events(logs) == ["cluster_version_valid"]
    seen.observe(None)
    assert seen.current_version() is None and seen.target_digests() == frozenset()


def test_a_target_this_node_has_not_pinned_is_said_once_and_then_its_pinning() -> None:
    pinned: set[str] = set()
    seen = watch(pinned)
    told: list[object] = []
    seen.listeners.append(told.append)
    with structlog.testing.capture_logs() as logs:
        seen.observe(cluster_version(NEW))
        seen.observe(cluster_version(NEW))
        pinned.add(NEW)
        seen.check_target()
        seen.check_target()
    assert events(logs) == ["upgrade_target_not_pinned", "upgrade_target_pinned"]
    assert logs[0]["digest"] == NEW and logs[0]["version"] == "4.16.5"
    assert seen.target_digests() == {NEW}
    assert len(told) == 2


def test_the_targets_carry_their_versions_for_the_metrics() -> None:
    seen = watch(set())
    assert seen.target_versions() == {}
    seen.observe(cluster_version(NEW))
    assert seen.target_versions() == {NEW: "4.16.5"}

"""The ClusterVersion view: well-formed objects as the CVO writes them, and every odd field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nodeagent.cluster.clusterversion import (
    COMPLETED,
    PARTIAL,
    REASON_INVALID,
    REASON_NOT_AN_UPGRADE,
    REASON_UNKNOWN,
    REASON_VERSION,
    check_upgrade_path,
    compare_versions,
    image_digest,
    parse_cluster_version,
    parse_semver,
)

OLD = "sha256:" + "1" * 64
NEW = "sha256:" + "2" * 64
NEXT = "sha256:" + "3" * 64
REPO = "quay.io/openshift-release-dev/ocp-release"


def cluster_version(**spec: Any) -> dict[str, Any]:
    """A ClusterVersion mid-upgrade from 4.16.3 to 4.16.5, as the CVO writes it."""
    return {
        "apiVersion": "config.openshift.io/v1",
        "kind": "ClusterVersion",
        "metadata": {"name": "version", "generation": 3},
        "spec": {"clusterID": "c0ffee00-0000-4000-8000-000000000000", "channel": "eus-4.16"} | spec,
        "status": {
            "observedGeneration": 3,
            "versionHash": "x",
            "availableUpdates": None,
            "desired": {"version": "4.16.5", "image": f"{REPO}@{NEW}"},
            "history": [
                {
                    "state": PARTIAL,
                    "version": "4.16.5",
                    "image": f"{REPO}@{NEW}",
                    "startedTime": "2026-11-28T10:00:00Z",
                    "completionTime": None,
                    "verified": True,
                },
                {
                    "state": COMPLETED,
                    "version": "4.16.3",
                    "image": f"{REPO}@{OLD}",
                    "startedTime": "2026-11-01T10:00:00Z",
                    "completionTime": "2026-11-01T11:02:03.5+00:00",
                    "verified": False,
                },
            ],
            "conditions": [
                {
                    "type": "Available",
                    "status": "True",
                    "lastTransitionTime": "2026-11-01T11:02:03Z",
                },
                {"type": "Progressing", "status": "True", "message": "Working towards 4.16.5"},
                {"type": "Failing", "status": "False"},
            ],
        },
    }


def test_a_cluster_mid_upgrade_reads_as_the_cvo_means_it() -> None:
    view = parse_cluster_version(
        cluster_version(
            desiredUpdate={"image": f"{REPO}@{NEW}", "version": "4.16.5", "force": False}
        )
    )
    assert view.is_usable, view.problems
    assert view.current is not None and view.current.version == "4.16.3"
    assert view.current.digest == OLD
    assert view.is_updating
    assert view.desired is not None and view.desired.digest == NEW
    assert view.desired_update is not None and view.desired_update.digest == NEW
    assert not view.desired_update.force
    assert view.channel == "eus-4.16"
    assert view.generation == view.observed_generation == 3
    assert view.is_condition_true("Progressing") and not view.is_condition_true("Failing")
    assert view.history[1].completion_time is not None
    assert view.history[1].completion_time.microsecond == 500000
    assert view.history[0].completion_time is None
    assert view.completed_digests() == {OLD}
    assert view.target_digests() == {NEW}


def test_a_completed_upgrade_has_no_target_but_a_new_desired_update() -> None:
    doc = cluster_version(desiredUpdate={"image": f"{REPO}@{NEXT}"})
    doc["status"]["history"][0]["state"] = COMPLETED
    doc["status"]["history"][0]["completionTime"] = "2026-11-28T11:00:00Z"
    view = parse_cluster_version(doc)
    assert view.is_usable
    assert view.current is not None and view.current.version == "4.16.5"
    assert not view.is_updating
    assert view.target_digests() == {NEXT}


def test_a_fresh_cluster_has_no_current_version() -> None:
    doc = cluster_version()
    del doc["status"]
    view = parse_cluster_version(doc)
    assert view.is_usable
    assert view.current is None and view.history == () and not view.is_updating


def _broken(path: str, value: object) -> dict[str, Any]:
    doc = cluster_version()
    target: Any = doc
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is KeyError:
        del target[keys[-1]]
    elif isinstance(target, list):
        target[int(keys[-1])] = value
    else:
        target[keys[-1]] = value
    return doc


ODD = [
    ("spec", "not a mapping", REASON_INVALID, "spec"),
    ("metadata", KeyError, REASON_INVALID, "metadata"),
    ("metadata.name", 7, REASON_INVALID, "metadata.name"),
    ("metadata.generation", -1, REASON_INVALID, "metadata.generation"),
    ("metadata.generation", True, REASON_INVALID, "metadata.generation"),
    ("status.history", {"a": 1}, REASON_INVALID, "status.history"),
    ("status.history.0", "Partial", REASON_INVALID, "status.history[0]"),
    ("status.history.0.state", "Done", REASON_INVALID, "status.history[0].state"),
    ("status.history.0.state", KeyError, REASON_INVALID, "status.history[0].state"),
    ("status.history.0.image", KeyError, REASON_INVALID, "status.history[0].image"),
    ("status.history.1.version", "4.16", REASON_VERSION, "status.history[1].version"),
    ("status.history.1.version", "v4.16.3", REASON_VERSION, "status.history[1].version"),
    ("status.history.1.version", "4.16.3-01", REASON_VERSION, "status.history[1].version"),
    ("status.history.1.version", "4" * 100, REASON_INVALID, "status.history[1].version"),
    ("status.history.1.startedTime", KeyError, REASON_INVALID, "status.history[1].startedTime"),
    ("status.history.1.startedTime", "yesterday", REASON_INVALID, "status.history[1].startedTime"),
    (
        "status.history.1.startedTime",
        "2026-11-01T10:00:00Z\n",
        REASON_INVALID,
        "status.history[1].startedTime",
    ),
    (
        "status.history.1.completionTime",
        "2026-13-45T99:00:00Z",
        REASON_INVALID,
        "status.history[1].completionTime",
    ),
    ("status.history.1.verified", "yes", REASON_INVALID, "status.history[1].verified"),
    ("status.history.1.image", "quay.io/x\x1b[31m", REASON_INVALID, "status.history[1].image"),
    ("status.desired", [], REASON_INVALID, "status.desired"),
    ("status.desired.version", 4.16, REASON_INVALID, "status.desired.version"),
    ("status.conditions.0.status", "Yes", REASON_INVALID, "status.conditions[0].status"),
    ("status.conditions.1", None, REASON_INVALID, "status.conditions[1]"),
    (
        "status.conditions.2.lastTransitionTime",
        5,
        REASON_INVALID,
        "status.conditions[2].lastTransitionTime",
    ),
    ("spec.channel", ["a"], REASON_INVALID, "spec.channel"),
    ("spec.desiredUpdate", {}, REASON_INVALID, "spec.desiredUpdate"),
    (
        "spec.desiredUpdate",
        {"force": "true", "image": "x"},
        REASON_INVALID,
        "spec.desiredUpdate.force",
    ),
    ("spec.desiredUpdate", {"version": "latest"}, REASON_VERSION, "spec.desiredUpdate.version"),
]


@pytest.mark.parametrize(("path", "value", "reason", "where"), ODD)
def test_every_odd_field_is_a_problem_with_a_reason_never_a_traceback(
    path: str, value: object, reason: str, where: str
) -> None:
    view = parse_cluster_version(_broken(path, value))
    assert not view.is_usable
    assert (reason, where) in {(p.reason, p.field) for p in view.problems}, view.problems
    for problem in view.problems:
        assert problem.message.isprintable() and len(problem.message) <= 400


@pytest.mark.parametrize("obj", [None, [], "version", 3, {"metadata": None, "spec": None}])
def test_not_an_object_at_all(obj: object) -> None:
    view = parse_cluster_version(obj)
    assert not view.is_usable and view.current is None and view.target_digests() == frozenset()


def test_a_history_longer_than_the_bound_is_read_up_to_it() -> None:
    doc = cluster_version()
    entry = doc["status"]["history"][1]
    doc["status"]["history"] = [copy.deepcopy(entry) for _ in range(1005)]
    view = parse_cluster_version(doc)
    assert len(view.history) == 1000
    assert [p.field for p in view.problems] == ["status.history"]


def test_a_bad_entry_is_dropped_and_the_others_kept() -> None:
    view = parse_cluster_version(_broken("status.history.0.state", "Weird"))
    assert [e.release.version for e in view.history] == ["4.16.3"]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("4.16.3", "4.16.3"),
        ("4.17.0-rc.1", "4.17.0-rc.1"),
        ("4.17.0-0.nightly-2026-01-01-000000", "4.17.0-0.nightly-2026-01-01-000000"),
        ("4.16.3+build.5", "4.16.3+build.5"),
        ("4.16", None),
        ("04.16.3", None),
        ("4.16.3-", None),
        ("4.16.3-rc..1", None),
        ("4.16.3 ", None),
        ("4.16.3\n", None),
        ("4.16.\u0663", None),  # an Arabic-Indic digit
        ("1" * 10 + ".0.0", None),
        (None, None),
        (4, None),
    ],
)
def test_semver(text: object, parsed: str | None) -> None:
    version = parse_semver(text)
    assert (str(version) if version else None) == parsed


@pytest.mark.parametrize(
    ("a", "b", "order"),
    [
        ("4.16.3", "4.16.3", 0),
        ("4.16.3", "4.16.10", -1),
        ("4.17.0", "4.16.99", 1),
        ("4.17.0-rc.1", "4.17.0", -1),
        ("4.17.0-rc.2", "4.17.0-rc.10", -1),
        ("4.17.0-rc.1", "4.17.0-rc.1.1", -1),
        ("4.17.0-1", "4.17.0-alpha", -1),
        ("4.17.0+a", "4.17.0+b", 0),
    ],
)
def test_version_order(a: str, b: str, order: int) -> None:
    left, right = parse_semver(a), parse_semver(b)
    assert left is not None and right is not None
    assert compare_versions(left, right) == order
    assert compare_versions(right, left) == -order


def test_image_digest() -> None:
    assert image_digest(f"{REPO}@{NEW}") == NEW
    assert image_digest(f"{REPO}:4.16.5") == ""
    assert image_digest(f"{REPO}@sha256:ABC") == ""
    assert image_digest(f"{REPO}@{NEW}\n") == ""


@pytest.mark.parametrize(
    ("current", "release", "previous", "reason", "is_upgrade"),
    [
        ("4.16.3", "4.16.5", ("4.16.2", "4.16.3"), "", True),
        ("4.16.3", "4.16.3", (), "", False),
        ("4.16.3", "4.16.5", ("4.16.2",), REASON_NOT_AN_UPGRADE, False),
        ("4.16.3", "4.16.5", (), REASON_NOT_AN_UPGRADE, False),
        ("4.16.5", "4.16.3", ("4.16.5",), REASON_NOT_AN_UPGRADE, False),  # a downgrade
        ("", "4.16.5", ("4.16.3",), REASON_UNKNOWN, False),
        ("4.16", "4.16.5", ("4.16",), REASON_VERSION, False),
        ("4.16.3", "latest", ("4.16.3",), REASON_VERSION, False),
    ],
)
def test_upgrade_path(
    current: str, release: str, previous: tuple[str, ...], reason: str, is_upgrade: bool
) -> None:
    verdict = check_upgrade_path(current, release, previous)
    assert verdict.reason == reason
    assert verdict.is_upgrade is is_upgrade
    if reason == REASON_NOT_AN_UPGRADE:
        assert current in verdict.message and release in verdict.message

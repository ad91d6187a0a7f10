"""The MachineConfigNode mirror: the machine-config-daemon's words, the API's bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodeagent.cluster.machine_config_node import (
    ERROR_BUDGET_CHARS,
    MAX_ERROR_CHARS,
    MAX_SETS,
    error_shares,
    machine_config_node_status,
)
from tests.unit.cluster.test_objects import NODE, NOW, a_set, node_status


def conditions(doc: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {
        c["type"]: (c["status"], c["reason"], c["message"]) for c in doc["status"]["conditions"]
    }


def test_all_pinned_reads_as_the_daemon_writes_it() -> None:
    doc = machine_config_node_status(NODE, node_status(a_set()), {"apps"}, [], NOW)
    assert doc["apiVersion"] == "machineconfiguration.openshift.io/v1"
    assert doc["kind"] == "MachineConfigNode"
    assert doc["status"]["pinnedImageSets"] == [
        {"name": "apps", "desiredGeneration": 2, "currentGeneration": 2}
    ]
    assert conditions(doc) == {
        "PinnedImageSetsProgressing": ("False", "AsExpected", "All pinned image sets complete"),
        "PinnedImageSetsDegraded": ("False", "AsExpected", "All is good"),
    }
    assert all(c["lastTransitionTime"] == NOW for c in doc["status"]["conditions"])


def test_pulling_and_a_failure() -> None:
    status = node_status(
        a_set("apps", state="Progressing"),
        a_set("bad", state="Degraded", reason="ImageNotFound", last_failed_generation=2,
              last_failed_error="r.io/x@sha256:1: ImageNotFound"),
    )  # fmt: skip
    doc = machine_config_node_status(NODE, status, {"apps", "bad"}, [], NOW)
    found = conditions(doc)
    prefetching = "node is prefetching images: edge-1"
    assert found["PinnedImageSetsProgressing"] == ("True", "ImagePrefetch", prefetching)
    failed = "bad: r.io/x@sha256:1: ImageNotFound"
    assert found["PinnedImageSetsDegraded"] == ("True", "PrefetchFailed", failed)
    bad = doc["status"]["pinnedImageSets"][1]
    assert bad["lastFailedGeneration"] == 2
    assert bad["lastFailedGenerationError"] == "r.io/x@sha256:1: ImageNotFound"


@pytest.mark.parametrize(("reason", "is_pool_degraded"), [
    ("InsufficientDiskSpace", True), ("NoSpaceLeft", True), ("ImageNotFound", False),
])  # fmt: skip
def test_only_a_full_disk_degrades_the_pool(reason: str, is_pool_degraded: bool) -> None:
    failed = a_set("bad", state="Degraded", reason=reason, last_failed_generation=2,
                   last_failed_error=f"{reason}: need 3 GiB")  # fmt: skip
    doc = machine_config_node_status(NODE, node_status(failed), {"bad"}, [], NOW)
    message = conditions(doc)["PinnedImageSetsDegraded"][2]
    assert message.startswith("Error: ") is is_pool_degraded


def test_only_the_api_sets_are_mirrored() -> None:
    status = node_status(a_set("apps"), a_set("Local_Set"), a_set("from-bundle"))
    doc = machine_config_node_status(NODE, status, {"apps"}, [], NOW)
    assert [s["name"] for s in doc["status"]["pinnedImageSets"]] == ["apps"]


def test_a_long_error_is_kept_whole_up_to_the_api_limit() -> None:
    error = "e" * 30000
    failed = a_set("bad", state="Degraded", last_failed_generation=2, last_failed_error=error)
    doc = machine_config_node_status(NODE, node_status(failed), {"bad"}, [], NOW)
    assert doc["status"]["pinnedImageSets"][0]["lastFailedGenerationError"] == error
    longer = a_set("bad", state="Degraded", last_failed_generation=2, last_failed_error="f" * 40000)
    doc = machine_config_node_status(NODE, node_status(longer), {"bad"}, [], NOW)
    kept = doc["status"]["pinnedImageSets"][0]["lastFailedGenerationError"]
    assert MAX_ERROR_CHARS - 64 < len(kept) <= MAX_ERROR_CHARS
    assert kept.endswith("more characters)")


def test_worst_case_stays_far_below_etcds_limit() -> None:
    """100 sets, each failing with an error of 4-byte characters beyond the API's limit."""
    sets = [
        a_set(f"set-{i:03d}", state="Degraded", reason="ImageNotFound", last_failed_generation=2,
              last_failed_error="\U0001f4a5" * 40000)
        for i in range(MAX_SETS + 20)
    ]  # fmt: skip
    names = {s.name for s in sets}
    doc = machine_config_node_status(NODE, node_status(*sets), names, [], NOW)
    items = doc["status"]["pinnedImageSets"]
    assert len(items) == MAX_SETS
    errors = [len(i["lastFailedGenerationError"]) for i in items]
    assert max(errors) <= MAX_ERROR_CHARS
    assert sum(errors) <= ERROR_BUDGET_CHARS + MAX_SETS * 32
    size = len(json.dumps(doc, ensure_ascii=False).encode())
    assert size < 600 * 1024, size  # etcd: 1.5 MiB per object
    assert all(len(c["message"]) <= 32768 for c in doc["status"]["conditions"])


@pytest.mark.parametrize(("lengths", "budget", "cap", "shares"), [
    ([10, 10], 100, 50, [10, 10]),
    ([10, 500], 100, 80, [10, 80]),  # the short one leaves its share to the long one
    ([500, 500, 500], 90, 80, [30, 30, 30]),
    ([], 100, 10, []),
])  # fmt: skip
def test_error_shares(lengths: list[int], budget: int, cap: int, shares: list[int]) -> None:
    assert error_shares(lengths, budget, cap) == shares
    assert sum(shares) <= budget

"""Which cluster sets apply to a node: OpenShift's pool association, or a label selector."""

from __future__ import annotations

from typing import Any

import yaml

from nodeagent.cluster.placement import node_pools, place, set_document
from nodeagent.selectors import parse_selector
from nodeagent.specs import parse_spec_text

DIGEST = "sha256:" + "a" * 64


def pool(name: str, node_selector: dict[str, Any] | None, sets: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": node_selector,
            "pinnedImageSets": [{"name": s} for s in sets],
        },
    }


def pis(name: str, labels: dict[str, str] | None = None, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "PinnedImageSet",
        "metadata": {
            "name": name,
            "labels": labels or {},
            "generation": generation,
            "uid": "u-" + name,
            "resourceVersion": "17",
            "managedFields": [{"manager": "kubectl"}],
            "creationTimestamp": "2026-11-22T00:00:00Z",
        },
        "spec": {"pinnedImages": [{"name": f"quay.example.com/app/{name}@{DIGEST}"}]},
    }


WORKER = {"node-role.kubernetes.io/worker": ""}
EDGE = {"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/edge": ""}
POOLS = [
    pool("worker", {"matchLabels": {"node-role.kubernetes.io/worker": ""}}, ["base", "gone"]),
    pool("edge", {"matchLabels": {"node-role.kubernetes.io/edge": ""}}, ["edge-apps"]),
    pool("master", {"matchLabels": {"node-role.kubernetes.io/master": ""}}, ["cp"]),
    pool("broken", None, ["never"]),
]
SETS = {name: pis(name) for name in ("base", "edge-apps", "cp", "never", "unlisted")}


def test_node_belongs_to_every_matching_pool() -> None:
    assert node_pools(EDGE, POOLS) == ["edge", "worker"]
    assert node_pools(WORKER, POOLS) == ["worker"]
    assert node_pools({}, POOLS) == []


def test_pools_mode_takes_the_sets_of_the_nodes_pools_and_reports_missing_ones() -> None:
    placement = place(EDGE, POOLS, SETS, parse_selector("anything=ignored"))
    assert placement.mode == "pools"
    assert placement.pools == ("edge", "worker")
    assert placement.sets == ("base", "edge-apps")
    assert placement.missing == ("gone",)
    assert "via pools edge, worker" in placement.describe()


def test_a_set_for_another_pool_is_ignored() -> None:
    assert "cp" not in place(WORKER, POOLS, SETS, parse_selector("")).sets
    assert place(WORKER, POOLS, SETS, parse_selector("")).sets == ("base",)


def test_selector_mode_without_pools() -> None:
    sets = {
        "a": pis("a", {"site": "ship"}),
        "b": pis("b", {"site": "shop"}),
        "c": pis("c"),
    }
    assert place(WORKER, None, sets, parse_selector("")).sets == ("a", "b", "c")
    chosen = place(WORKER, None, sets, parse_selector("site=ship"))
    assert (chosen.mode, chosen.sets, chosen.pools) == ("selector", ("a",), ())
    assert place(WORKER, None, sets, parse_selector("site")).sets == ("a", "b")


def test_set_document_is_a_valid_spec_file_that_keeps_provenance() -> None:
    doc = set_document(pis("base", {"site": "ship"}, generation=4))
    assert "managedFields" not in doc["metadata"]
    assert "creationTimestamp" not in doc["metadata"]
    assert doc["metadata"]["uid"] == "u-base"
    loaded = parse_spec_text(yaml.safe_dump(doc), source="cache/base.yaml", is_persistent=True)
    assert loaded.problems == ()
    (image_set,) = loaded.sets
    assert (image_set.name, image_set.generation) == ("base", 4)
    assert dict(image_set.labels) == {"site": "ship"}
    assert [str(r) for r in image_set.images] == [f"quay.example.com/app/base@{DIGEST}"]

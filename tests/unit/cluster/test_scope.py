"""Which Nodes the site view judges: the selector, the bundle's published target, or every
Node; never a guess when the holders disagree."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.cluster.holdings import HeldBundle, HeldTarget, Holdings, holdings_of
from nodeagent.cluster.scope import choose_scope, node_architecture
from nodeagent.errors import ConfigInvalid

BUNDLE = "edge-4.18.3"
DIGEST = "sha256:" + "1" * 64
EDGE_AMD64 = HeldTarget("amd64", "node-role.kubernetes.io/edge")


def node(name: str, arch: str | None = "amd64", *, edge: bool = True, info: str = "") -> Any:
    labels = {"node-role.kubernetes.io/edge": ""} if edge else {}
    if arch is not None:
        labels["kubernetes.io/arch"] = arch
    obj: dict[str, Any] = {"metadata": {"name": name, "labels": labels}}
    if info:
        obj["status"] = {"nodeInfo": {"architecture": info}}
    return obj


NODES = [
    node("edge-a"),
    node("edge-b"),
    node("edge-arm", "arm64"),
    node("worker-a", edge=False),
]


def holding(name: str, target: HeldTarget | None, bundle_id: str = BUNDLE) -> Holdings:
    held = HeldBundle(bundle_id, DIGEST, True, 3, 100, target)
    return holdings_of(name, [held], is_serving=True, address="10.0.0.1:9447")


def by_node(*held: Holdings) -> dict[str, Holdings]:
    return {h.node: h for h in held}


def test_without_a_selector_the_target_of_the_holders_chooses_selector_and_architecture() -> None:
    held = by_node(holding("edge-a", EDGE_AMD64), holding("edge-b", EDGE_AMD64))
    scope = choose_scope(NODES, held, BUNDLE, None)
    assert scope.nodes == ("edge-a", "edge-b")
    assert scope.target == EDGE_AMD64
    assert "the bundle's target, amd64 Nodes matching 'node-role.kubernetes.io/edge'" in (
        scope.description
    )
    assert "(published by 2 nodes that hold it)" in scope.description


def test_a_target_without_a_selector_is_every_node_of_its_architecture() -> None:
    held = by_node(holding("edge-arm", HeldTarget("arm64", "")))
    scope = choose_scope(NODES, held, BUNDLE, None)
    assert scope.nodes == ("edge-arm",)
    assert "every arm64 Node" in scope.description


def test_the_architecture_comes_from_the_label_else_the_kubelets_report() -> None:
    assert node_architecture(node("x", "arm64", info="amd64")) == "arm64"
    assert node_architecture(node("x", None, info="arm64")) == "arm64"
    assert node_architecture(node("x", None)) == ""
    nodes = [node("by-info", None, info="arm64"), node("unknown", None), node("amd", "amd64")]
    scope = choose_scope(nodes, by_node(holding("amd", HeldTarget("arm64", ""))), BUNDLE, None)
    # a Node whose architecture nothing says stays in scope: a laggard, never skipped
    assert scope.nodes == ("by-info", "unknown")


def test_no_holder_yet_means_every_node_and_says_the_target_is_not_known() -> None:
    other = by_node(holding("edge-a", EDGE_AMD64, bundle_id="another"))
    for held in ({}, other, by_node(holding("edge-a", None))):
        scope = choose_scope(NODES, held, BUNDLE, None)
        assert scope.nodes == ("edge-a", "edge-arm", "edge-b", "worker-a")
        assert scope.target is None
        assert scope.description == (
            "scope: every Node; the bundle's target is not known until a node holds it"
        )


def test_a_holder_without_a_target_does_not_outvote_those_that_publish_one() -> None:
    held = by_node(holding("edge-a", EDGE_AMD64), holding("worker-a", None))
    assert choose_scope(NODES, held, BUNDLE, None).nodes == ("edge-a", "edge-b")


@pytest.mark.parametrize(
    "other", [HeldTarget("arm64", "node-role.kubernetes.io/edge"), HeldTarget("amd64", "")]
)
def test_holders_that_disagree_on_the_target_are_refused_not_outvoted(other: HeldTarget) -> None:
    held = by_node(
        holding("edge-a", EDGE_AMD64), holding("edge-b", EDGE_AMD64), holding("worker-a", other)
    )
    with pytest.raises(ConfigInvalid, match="2 different targets") as refused:
        choose_scope(NODES, held, BUNDLE, None)
    assert refused.value.exit_code == 78
    assert "pass --selector" in refused.value.message
    assert "worker-a" in refused.value.message
    assert "edge-a and 1 more" in refused.value.message
    # the selector settles it
    assert choose_scope(NODES, held, BUNDLE, "zone=x").nodes == ()


def test_a_selector_overrides_the_target_and_an_empty_one_means_every_node() -> None:
    held = by_node(holding("edge-a", EDGE_AMD64))
    scope = choose_scope(NODES, held, BUNDLE, "kubernetes.io/arch=arm64")
    assert scope.nodes == ("edge-arm",)
    assert scope.description == "scope: Nodes matching 'kubernetes.io/arch=arm64' (--selector)"
    assert scope.target is None
    every = choose_scope(NODES, held, BUNDLE, "")
    assert every.nodes == ("edge-a", "edge-arm", "edge-b", "worker-a")
    assert every.description == "scope: every Node"


def test_every_bundle_without_a_selector_is_every_node() -> None:
    held = by_node(holding("edge-a", EDGE_AMD64))
    assert choose_scope(NODES, held, None, None).nodes == (
        "edge-a", "edge-arm", "edge-b", "worker-a",
    )  # fmt: skip


def test_a_bad_selector_is_a_config_error() -> None:
    with pytest.raises(ConfigInvalid):
        choose_scope(NODES, {}, BUNDLE, "a in (")

"""Pool membership by the machine-config-operator's rules (``GetPoolsForNode``).

Each row is one rule of docs/runtime-facts.md, "machine-config-daemon behaviour"."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.cluster.placement import place
from nodeagent.cluster.pools import PoolMembership, pools_for_node
from nodeagent.errors import PoolMembershipInvalid
from nodeagent.selectors import parse_selector

MASTER_L = "node-role.kubernetes.io/master"
WORKER_L = "node-role.kubernetes.io/worker"
INFRA_L = "node-role.kubernetes.io/infra"
EDGE_L = "node-role.kubernetes.io/edge"


def pool(name: str, selector: dict[str, Any] | None, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"nodeSelector": selector, "pinnedImageSets": [{"name": s} for s in sets]},
    }


def role(label: str) -> dict[str, Any]:
    return {"matchLabels": {label: ""}}


POOLS = [
    pool("master", role(MASTER_L), ("cp-set",)),
    pool("worker", role(WORKER_L), ("worker-set",)),
    pool("infra", role(INFRA_L), ("infra-set",)),
    pool("edge", role(EDGE_L), ("edge-set",)),
    pool("empty", {}, ("empty-set",)),
    pool("none", None, ("none-set",)),
]


def labels(*keys: str, **extra: str) -> dict[str, str]:
    return {key: "" for key in keys} | extra


@pytest.mark.parametrize(
    ("node_labels", "expected"),
    [
        # a plain worker
        (labels(WORKER_L), PoolMembership(("worker",))),
        # master beats worker: compact and single-node masters carry the worker label
        (labels(MASTER_L, WORKER_L), PoolMembership(("master",))),
        (labels(MASTER_L), PoolMembership(("master",))),
        # a node in a custom pool also takes the worker pool when worker matches
        (labels(WORKER_L, INFRA_L), PoolMembership(("infra", "worker"))),
        # a custom pool alone: no worker pool when worker does not match
        (labels(INFRA_L), PoolMembership(("infra",))),
        # master plus a custom pool: master wins, the custom pool is ignored (and reported)
        (labels(MASTER_L, INFRA_L), PoolMembership(("master",), ignored_custom="infra")),
        (labels(MASTER_L, WORKER_L, INFRA_L), PoolMembership(("master", "worker"), "infra")),
        # an empty or missing selector matches no node, not every node
        (labels(), PoolMembership(())),
        (labels("unrelated"), PoolMembership(())),
        # a Windows node belongs to no pool
        (labels(WORKER_L, **{"kubernetes.io/os": "windows"}), PoolMembership(())),
        (labels(WORKER_L, **{"kubernetes.io/os": "linux"}), PoolMembership(("worker",))),
    ],
)
def test_pools_for_node_follows_the_mco_rules(
    node_labels: dict[str, str], expected: PoolMembership
) -> None:
    assert pools_for_node("n1", node_labels, POOLS) == expected


@pytest.mark.parametrize(
    "node_labels", [labels(WORKER_L, INFRA_L, EDGE_L), labels(MASTER_L, INFRA_L, EDGE_L)]
)
def test_more_than_one_custom_pool_is_refused_with_a_reason(node_labels: dict[str, str]) -> None:
    with pytest.raises(PoolMembershipInvalid) as caught:
        pools_for_node("n1.example.com", node_labels, POOLS)
    assert caught.value.reason == "PoolMembershipInvalid"
    assert "n1.example.com matches 2 custom MachineConfigPools (edge, infra)" in str(caught.value)


def test_a_pool_name_from_the_api_is_escaped_in_the_message() -> None:
    pools = [pool("a\x1b[31m", role(INFRA_L)), pool("b", role(INFRA_L))]
    with pytest.raises(PoolMembershipInvalid) as caught:
        pools_for_node("n1", labels(INFRA_L), pools)
    assert "\x1b" not in caught.value.message


def test_place_takes_the_sets_of_the_chosen_pools_only() -> None:
    sets = {name: {"metadata": {"name": name}} for name in ("cp-set", "worker-set", "infra-set")}
    everything = parse_selector("")
    sno = place(labels(MASTER_L, WORKER_L), POOLS, sets, everything)
    assert (sno.pools, sno.sets, sno.message) == (("master",), ("cp-set",), "")
    infra = place(labels(WORKER_L, INFRA_L), POOLS, sets, everything)
    assert infra.sets == ("infra-set", "worker-set")
    master_infra = place(labels(MASTER_L, INFRA_L), POOLS, sets, everything)
    assert master_infra.sets == ("cp-set",)
    assert "custom pool infra also matches this master node" in master_infra.message

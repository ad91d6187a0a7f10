"""The MachineConfigPools a node belongs to, as the machine-config-operator decides (pure).

The rules of ``GetPoolsForNode`` (docs/runtime-facts.md, "machine-config-daemon behaviour"):

* A pool matches when its ``nodeSelector`` is not empty and matches the node's labels; an
  empty or missing selector matches no node. A Windows node (``kubernetes.io/os=windows``)
  belongs to no pool.
* ``master`` and ``worker`` are the two standard pools; any other name is a custom pool.
* More than one matching custom pool: the node belongs to none (``PoolMembershipInvalid``).
* One custom pool: the node belongs to it, or to ``master`` instead when ``master`` matches
  too (the custom pool is then ignored and reported), plus ``worker`` when ``worker`` matches.
* No custom pool: ``master`` alone when it matches (compact and single-node clusters, whose
  masters carry the worker label, do not take the worker pool's sets), else ``worker``.

The first pool of the result is the node's primary pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent.errors import PoolMembershipInvalid
from nodeagent.selectors import selector_from_object
from nodeagent.strict import clip

MASTER = "master"
WORKER = "worker"
OS_LABEL = "kubernetes.io/os"


@dataclass(frozen=True, slots=True)
class PoolMembership:
    pools: tuple[str, ...]
    """The node's pools, primary first (MCO order), then ``worker`` when it applies."""
    ignored_custom: str = ""
    """A custom pool that matched a master node and was ignored in favour of ``master``."""


def matching_pools(node_labels: Mapping[str, str], pools: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the pools whose non-empty node selector matches the labels, sorted."""
    names = []
    for pool in pools:
        selector = selector_from_object((pool.get("spec") or {}).get("nodeSelector"))
        if selector.requirements and selector.matches(node_labels):
            names.append(pool_name(pool))
    return sorted(n for n in names if n)


def pools_for_node(
    node_name: str, node_labels: Mapping[str, str], pools: Iterable[Mapping[str, Any]]
) -> PoolMembership:
    """The node's pools by the machine-config-operator's rules. Raises PoolMembershipInvalid."""
    if node_labels.get(OS_LABEL) == "windows":
        return PoolMembership(())
    matched = matching_pools(node_labels, pools)
    master = MASTER in matched
    worker = (WORKER,) if WORKER in matched else ()
    custom = [name for name in matched if name not in (MASTER, WORKER)]
    if len(custom) > 1:
        raise PoolMembershipInvalid(
            f"node {clip(node_name)} matches {len(custom)} custom MachineConfigPools "
            f"({', '.join(clip(n) for n in custom)}); a node may be in one custom pool at most: "
            "change the node's labels or the pools' node selectors"
        )
    if custom and master:
        return PoolMembership((MASTER, *worker), ignored_custom=custom[0])
    if custom:
        return PoolMembership((custom[0], *worker))
    if master:
        return PoolMembership((MASTER,))
    return PoolMembership(worker)


def pool_name(obj: Mapping[str, Any]) -> str:
    name = (obj.get("metadata") or {}).get("name")
    return name if isinstance(name, str) else ""

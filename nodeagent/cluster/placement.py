"""Which PinnedImageSets from the cluster apply to this node (pure).

Two ways, decided by what the cluster has:

* **Pools** (OpenShift, the ``MachineConfigPool`` API exists): the node takes the sets listed
  in ``spec.pinnedImageSets[].name`` of its pools, chosen as the machine-config-operator
  chooses them (``pools.pools_for_node``: master beats worker, one custom pool plus worker,
  an empty selector matches nothing). A node in more than one custom pool raises
  ``PoolMembershipInvalid``. A pool may list a set that does not exist (yet): it is
  reported, never guessed.
* **Selector** (no pools): every set whose labels match ``[cluster] set_selector``; the
  default empty selector takes them all.

The chosen sets are kept on disk as spec files (``set_document``) so the node keeps
converging from its last known specs while the API server is unreachable, and after a reboot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nodeagent.cluster.pools import matching_pools, pool_name, pools_for_node
from nodeagent.selectors import Selector
from nodeagent.specs import API_VERSION, KIND, file_stem
from nodeagent.strict import clip

Mode = Literal["pools", "selector"]
CACHE_HEADER = (
    "# Written by nodeagent from the cluster's PinnedImageSet {name!r}; the cluster copy wins.\n"
    "# Kept so the node keeps its pins while the API server is unreachable.\n"
)


@dataclass(frozen=True, slots=True)
class Placement:
    mode: Mode
    pools: tuple[str, ...]
    """The node's pools, sorted (pools mode only)."""
    sets: tuple[str, ...]
    """Names of the sets that apply and exist, sorted."""
    missing: tuple[str, ...] = ()
    """Sets a pool of this node lists that the API does not have, sorted."""
    reason: str = ""
    """Why the node's pools could not be decided (a reason code; the sets are then the last
    known ones), or ``""``."""
    message: str = ""
    """What to do about ``reason``; or a note such as a custom pool ignored on a master."""

    def describe(self) -> str:
        where = f"pools {', '.join(self.pools) or '(none)'}" if self.mode == "pools" else "selector"
        return f"{len(self.sets)} set(s) via {where}"


def node_pools(node_labels: Mapping[str, str], pools: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the pools whose (non-empty) node selector matches the node's labels, sorted."""
    return matching_pools(node_labels, pools)


def place(
    node_labels: Mapping[str, str],
    pools: Iterable[Mapping[str, Any]] | None,
    sets: Mapping[str, Mapping[str, Any]],
    selector: Selector,
    *,
    node_name: str = "",
) -> Placement:
    """The sets for this node; ``pools`` is None when the cluster has no MachineConfigPool API.
    Raises PoolMembershipInvalid (pools mode, more than one custom pool)."""
    if pools is None:
        chosen = [name for name, obj in sets.items() if selector.matches(_labels(obj))]
        return Placement("selector", (), tuple(sorted(chosen)))
    pool_list = list(pools)
    membership = pools_for_node(node_name, node_labels, pool_list)
    listed: set[str] = set()
    for pool in pool_list:
        if pool_name(pool) in membership.pools:
            listed.update(_listed_sets(pool))
    present = sorted(n for n in listed if n in sets)
    missing = sorted(n for n in listed if n not in sets)
    note = ""
    if membership.ignored_custom:
        note = (
            f"custom pool {clip(membership.ignored_custom)} also matches this master node and is "
            "ignored, as the machine-config-operator ignores it"
        )
    return Placement("pools", membership.pools, tuple(present), tuple(missing), message=note)


def set_document(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an API object that make a spec file: what ``specs`` reads, and provenance."""
    metadata = obj.get("metadata") or {}
    kept: dict[str, Any] = {"name": metadata.get("name")}
    for key in ("generation", "labels", "uid", "resourceVersion"):
        if metadata.get(key) not in (None, {}):
            kept[key] = metadata[key]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": kept,
        "spec": {"pinnedImages": list((obj.get("spec") or {}).get("pinnedImages") or [])},
    }


def cache_file_name(set_name: str) -> str:
    """The set's file in the cluster cache: ``<name>.yaml``, a long name hash-suffixed
    (``specs.file_stem``)."""
    return f"{file_stem(set_name)}.yaml"


def _listed_sets(pool: Mapping[str, Any]) -> list[str]:
    spec = pool.get("spec") or {}
    items = spec.get("pinnedImageSets") or []
    names = [item.get("name") for item in items if isinstance(item, Mapping)]
    return [n for n in names if isinstance(n, str) and n]


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}

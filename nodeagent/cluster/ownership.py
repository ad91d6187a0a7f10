"""Who pins the cluster's PinnedImageSets on this node: nodeagent or the machine-config-daemon.

On OpenShift 4.19+ the machine-config-daemon (MCD) pins the sets its pools list and writes
the MachineConfigNode's ``PinnedImageSets*`` conditions. Two agents pulling the same sets
and writing the same conditions fight, so ``[cluster] api_sets`` decides (decision 0044):

* ``"auto"`` (default): the MCD, when the cluster has MachineConfigPools **and** this Node
  carries the ``machineconfiguration.openshift.io/currentConfig`` annotation the MCD sets on
  every node it manages; nodeagent otherwise. The MCD's own pin file cannot tell: it exists
  only while the MCD has pins (docs/runtime-facts.md, "machine-config-daemon behaviour").
* ``"nodeagent"``: nodeagent takes the API sets (and may mirror the MachineConfigNode).
* ``"mcd"``: the API sets are the MCD's, whatever the Node says.

Whoever owns the API sets, nodeagent keeps bundles, local spec files and its own reporting,
and its drop-in keeps restating every other file's pins (the MCD's included).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

Owner = Literal["nodeagent", "mcd"]
API_SETS_MODES: Final = ("auto", "nodeagent", "mcd")
MCD_ANNOTATION: Final = "machineconfiguration.openshift.io/currentConfig"
"""Set by the machine-config-daemon on every Node it manages (the rendered config it runs)."""


@dataclass(frozen=True, slots=True)
class Ownership:
    owner: Owner
    why: str
    """For the journal: which rule decided."""

    @property
    def is_ours(self) -> bool:
        """Whether nodeagent pins the API's sets and may mirror the MachineConfigNode."""
        return self.owner == "nodeagent"


def is_mcd_managed(node: Mapping[str, Any] | None) -> bool:
    """Whether the Node carries the machine-config-daemon's ``currentConfig`` annotation."""
    metadata = (node or {}).get("metadata") or {}
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return False
    value = annotations.get(MCD_ANNOTATION)
    return isinstance(value, str) and bool(value)


def api_sets_owner(mode: str, node: Mapping[str, Any] | None, *, has_pools: bool) -> Ownership:
    """Who pins the API's sets, for ``[cluster] api_sets`` = ``mode``."""
    if mode == "nodeagent":
        return Ownership("nodeagent", "api_sets = nodeagent")
    if mode == "mcd":
        return Ownership("mcd", "api_sets = mcd")
    if not has_pools:
        return Ownership("nodeagent", "no MachineConfigPool API: no machine-config-daemon")
    if is_mcd_managed(node):
        return Ownership("mcd", f"the Node carries {MCD_ANNOTATION}")
    return Ownership("nodeagent", f"the Node does not carry {MCD_ANNOTATION}")

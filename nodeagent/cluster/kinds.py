"""The Kubernetes resource kinds nodeagent reads and writes (pure values)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResourceKind:
    group: str
    """API group; ``""`` is the core group (``/api/v1``)."""
    version: str
    kind: str
    plural: str
    is_namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


MCO_GROUP = "machineconfiguration.openshift.io"
PINNED_IMAGE_SET = ResourceKind(MCO_GROUP, "v1", "PinnedImageSet", "pinnedimagesets")
MACHINE_CONFIG_POOL = ResourceKind(MCO_GROUP, "v1", "MachineConfigPool", "machineconfigpools")
MACHINE_CONFIG_NODE = ResourceKind(MCO_GROUP, "v1", "MachineConfigNode", "machineconfignodes")
NODE = ResourceKind("", "v1", "Node", "nodes")
EVENT = ResourceKind("", "v1", "Event", "events", is_namespaced=True)
CONFIG_MAP = ResourceKind("", "v1", "ConfigMap", "configmaps", is_namespaced=True)
POD = ResourceKind("", "v1", "Pod", "pods", is_namespaced=True)
NODE_IMAGE_STATUS = ResourceKind("nodeagent.io", "v1alpha1", "NodeImageStatus", "nodeimagestatuses")
NODE_IMAGE_HOLDINGS = ResourceKind(
    "nodeagent.io", "v1alpha1", "NodeImageHoldings", "nodeimageholdings"
)
CLUSTER_VERSION = ResourceKind("config.openshift.io", "v1", "ClusterVersion", "clusterversions")

"""Objects for cluster-mode tests: the deploy/ manifests, test sets, pools and readers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.testenv.kube import KubeCluster
from tests.testenv.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MCO_MINIMAL = Path(__file__).parent / "manifests" / "machineconfiguration-minimal.yaml"
"""A hand-made MachineConfigPool CRD (the fields nodeagent reads)."""
MCN_CRD = Path(__file__).parent / "manifests" / "machineconfignode-v1.yaml"
"""openshift/api's MachineConfigNode v1 schema (source in its header)."""
MCO_CRDS = (
    "machineconfigpools.machineconfiguration.openshift.io",
    "machineconfignodes.machineconfiguration.openshift.io",
)


def install_deploy(kube: KubeCluster) -> None:
    """Everything in deploy/ (CRDs first), then wait until the CRDs are served."""
    kube.kubectl_ok("apply", "--server-side", "-f", str(DEPLOY / "crds"))
    kube.kubectl_ok(
        "wait", "--for=condition=Established", "--timeout=60s", "-f", str(DEPLOY / "crds")
    )
    for name in ("rbac.yaml", "admission-policy.yaml"):
        kube.kubectl_ok("apply", "--server-side", "-f", str(DEPLOY / name))


def install_mco(kube: KubeCluster) -> None:
    for crd in (MCO_MINIMAL, MCN_CRD):
        kube.kubectl_ok("apply", "--server-side", "-f", str(crd))
        kube.kubectl_ok("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crd))


def remove_mco(kube: KubeCluster) -> None:
    for crd in (MCO_MINIMAL, MCN_CRD):
        kube.kubectl("delete", "--ignore-not-found", "--wait=true", "-f", str(crd))
    wait_for(
        lambda: kube.kubectl("get", "crd", *MCO_CRDS).returncode != 0,
        timeout_s=60,
        what="machine-config CRDs removed",
    )


def apply(kube: KubeCluster, obj: dict[str, Any], *, kubeconfig: Path | None = None) -> str:
    return kube.kubectl_ok(
        "apply", "--server-side", "--field-manager=test-admin", "-f", "-",
        kubeconfig=kubeconfig, input=json.dumps(obj),
    )  # fmt: skip


def get(kube: KubeCluster, resource: str, name: str, namespace: str = "") -> dict[str, Any] | None:
    ns = ["-n", namespace] if namespace else []
    result = kube.kubectl("get", resource, name, "-o", "json", "--show-managed-fields", *ns)
    if result.returncode != 0:
        if "NotFound" in result.stderr:
            return None
        raise RuntimeError(result.stderr)
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def pinned_image_set(
    name: str, refs: list[str], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "PinnedImageSet",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"pinnedImages": [{"name": ref} for ref in refs]},
    }


def pool(name: str, node_labels: dict[str, str], sets: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfigPool",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": node_labels},
            "pinnedImageSets": [{"name": s} for s in sets],
        },
    }


def machine_config_node(node: str, pool_name: str) -> dict[str, Any]:
    """A MachineConfigNode as the machine-config-operator creates it (its required spec)."""
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfigNode",
        "metadata": {"name": node},
        "spec": {
            "node": {"name": node},
            "pool": {"name": pool_name},
            "configVersion": {"desired": f"rendered-{pool_name}-0"},
        },
    }


def cluster_config(
    kube: KubeCluster,
    node: str,
    *,
    selector: str = "",
    mirror_mcn: bool = False,
    api_sets: str = "auto",
) -> str:
    """The [cluster] section for a test agent running as ``node``."""
    return f"""
[cluster]
enabled = true
kubeconfig = "{kube.kubeconfig_for_node(node)}"
node_name = "{node}"
set_selector = "{selector}"
status_interval_s = 0.5
heartbeat_s = 2.0
request_timeout_s = 10.0
machine_config_node = {"true" if mirror_mcn else "false"}
api_sets = "{api_sets}"
"""


def set_entry(nis: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    for item in ((nis or {}).get("status") or {}).get("pinnedImageSets", []):
        if item["name"] == name:
            return dict(item)
    return None


def condition(nis: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for item in ((nis or {}).get("status") or {}).get("conditions", []):
        if item["type"] == kind:
            return dict(item)
    return None

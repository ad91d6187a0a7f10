"""Beside the machine-config-daemon (decision 0044), against a real kube-apiserver and CRI-O.

With ``[cluster] api_sets = "auto"`` a Node that carries the machine-config-daemon's
``currentConfig`` annotation leaves its pools' PinnedImageSets to that daemon: nodeagent
pins none of them and writes no MachineConfigNode status. When the annotation goes,
nodeagent takes the sets and mirrors the MachineConfigNode.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Pushed
from tests.integration.cluster.test_cluster_mode import is_complete, wait_nis
from tests.integration.pins.test_flow import pinned_flags
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import (
    apply,
    cluster_config,
    get,
    install_deploy,
    install_mco,
    machine_config_node,
    pinned_image_set,
    pool,
    remove_mco,
    set_entry,
)
from tests.testenv.waiting import wait_for

ROLE = {"node-role.kubernetes.io/mcdside": ""}
MCD_ANNOTATION = "machineconfiguration.openshift.io/currentConfig"


@pytest.fixture
def mco(kube: KubeCluster) -> Iterator[KubeCluster]:
    install_deploy(kube)
    install_mco(kube)
    yield kube
    remove_mco(kube)


async def test_api_sets_follow_the_mcd_annotation(
    mco: KubeCluster, fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    kube = mco
    node = "mcd-managed-1"
    kube.create_node(node, ROLE)
    kube.kubectl_ok("annotate", "node", node, f"{MCD_ANNOTATION}=rendered-worker-0123")
    a = pushed.ref(pushed.base_a)
    apply(kube, pinned_image_set("mcd-apps", [a]))
    apply(kube, pool("mcdside", ROLE, ["mcd-apps"]))
    apply(kube, machine_config_node(node, "mcdside"))
    agent = Agent(
        tmp_path / "agent", fresh_crio, extra_config=cluster_config(kube, node, mirror_mcn=True)
    )
    with agent:
        # The daemon's Node carries the annotation: the set is the MCD's, nothing pinned.
        nis = wait_nis(
            kube, node,
            lambda n: (n.get("status") or {}).get("placement", {}).get("pools") == ["mcdside"],
            what="status written with the pool known", agent=agent,
        )  # fmt: skip
        assert set_entry(nis, "mcd-apps") is None
        assert "api_sets_owner" in agent.log_text() and "owner=mcd" in agent.log_text()
        assert await pinned_flags(fresh_crio, [a]) == {a: None}
        mcn = get(kube, "machineconfignodes", node)
        assert mcn is not None and "status" not in mcn, mcn

        # The annotation goes (no machine-config-daemon here): nodeagent takes the set.
        kube.kubectl_ok("annotate", "node", node, f"{MCD_ANNOTATION}-")
        wait_nis(kube, node, is_complete("mcd-apps", 1), what="mcd-apps pinned", agent=agent)
        assert await pinned_flags(fresh_crio, [a]) == {a: True}
        mirrored = wait_for(
            lambda: (get(kube, "machineconfignodes", node) or {}).get("status"),
            timeout_s=30, what="MachineConfigNode mirrored",
            detail=lambda: agent.log_text()[-4000:],
        )  # fmt: skip
        assert [s["name"] for s in mirrored["pinnedImageSets"]] == ["mcd-apps"]
    kube.kubectl_ok("delete", "pinnedimageset", "mcd-apps")


async def test_api_sets_mcd_leaves_sets_without_the_annotation(
    mco: KubeCluster, fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    kube = mco
    node = "mcd-explicit-1"
    kube.create_node(node, ROLE)
    b = pushed.ref(pushed.base_b)
    apply(kube, pinned_image_set("mcd-only", [b]))
    apply(kube, pool("mcdside", ROLE, ["mcd-only"]))
    config = cluster_config(kube, node, api_sets="mcd")
    with Agent(tmp_path / "agent", fresh_crio, extra_config=config) as agent:
        nis = wait_nis(
            kube, node,
            lambda n: (n.get("status") or {}).get("placement", {}).get("pools") == ["mcdside"],
            what="status written with the pool known", agent=agent,
        )  # fmt: skip
        assert set_entry(nis, "mcd-only") is None
        assert "api_sets = mcd" in agent.log_text()
        assert await pinned_flags(fresh_crio, [b]) == {b: None}
    kube.kubectl_ok("delete", "pinnedimageset", "mcd-only")

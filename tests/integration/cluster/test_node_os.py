"""The node's OS image reaches its NodeImageStatus: the real daemon, apiserver and CRI-O.

``[node_os]`` points at an os-release file and an ``rpm-ostree`` stand-in (a script printing
the recorded output of tests/unit/nodeos/fixtures); ``bootc`` is absent, as on RHCOS before
image mode. The status shows what the recorded output says, and the table (``-o wide``)
its OS columns.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.integration.cluster.test_api_exactness import table
from tests.integration.cluster.test_cluster_mode import wait_nis
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import cluster_config, install_deploy

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[2] / "unit" / "nodeos" / "fixtures"
DIGEST = "sha256:1b2c3d4e5f60718293a4b5c6d7e8f9012a3b4c5d6e7f8091a2b3c4d5e6f7a8b9"


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    return kube


def test_the_status_reports_the_os_release_and_the_booted_image(
    cluster: KubeCluster, fresh_crio: Crio, tmp_path: Path
) -> None:
    node = "edge-node-os-1"
    cluster.create_node(node)
    tools = tmp_path / "tools"
    tools.mkdir()
    rpm_ostree = tools / "rpm-ostree"
    fixture = shlex.quote(str(FIXTURES / "rpm-ostree-status-container.json"))
    rpm_ostree.write_text(f'#!/bin/sh\n[ "$*" = "status --json" ] || exit 2\ncat {fixture}\n')
    rpm_ostree.chmod(0o755)
    node_os = f"""
[node_os]
os_release = "{FIXTURES / "os-release-rhcos"}"
bootc = "{tools / "bootc"}"
rpm_ostree = "{rpm_ostree}"
timeout_s = 10
"""
    agent = Agent(
        tmp_path / "agent", fresh_crio, extra_config=cluster_config(cluster, node) + node_os
    )
    try:
        with agent:
            nis = wait_nis(
                cluster,
                node,
                lambda n: "booted" in (n.get("status") or {}).get("osImage", {}),
                what="osImage reported",
                agent=agent,
            )
            assert nis["status"]["osImage"] == {
                "id": "rhcos",
                "versionId": "4.18",
                "version": "418.94.202509240704-0",
                "prettyName": "Red Hat Enterprise Linux CoreOS 418.94.202509240704-0",
                "booted": {
                    "source": "rpm-ostree",
                    "image": f"quay.io/openshift-release-dev/ocp-v4.0-art-dev@{DIGEST}",
                    "digest": DIGEST,
                    "version": "418.94.202509240704-0",
                },
            }
            found = table(cluster, f"/apis/nodeagent.io/v1alpha1/nodeimagestatuses/{node}")
            names = [c["name"] for c in found["columnDefinitions"]]
            shown = dict(zip(names, found["rows"][0]["cells"], strict=True))
            assert (shown["OS"], shown["OS-Digest"]) == ("4.18", DIGEST)
            assert "node_os_read" in agent.log_text()
    finally:
        cluster.kubectl("delete", "node", node, "--wait=false")

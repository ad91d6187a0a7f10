"""The node mirror reaches NodeImageStatus (``status.nodeMirror``), accepted by the CRD's
schema on the real apiserver: the daemon, ``nodeagent serve-mirror`` and a local client."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.adapters.http.test_node_mirror_process import DIGEST, ask
from tests.integration.cluster.test_cluster_mode import wait_nis
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import cluster_config, install_deploy
from tests.testenv.registry import free_port
from tests.testenv.waiting import log_tail, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    return kube


def test_the_node_mirror_is_in_the_node_s_status(
    cluster: KubeCluster, fresh_crio: Crio, tmp_path: Path
) -> None:
    node = "edge-node-mirror-1"
    cluster.create_node(node)
    port = free_port()
    mirror = f'[mirror]\nlisten = "127.0.0.1:{port}"\n'
    agent = Agent(
        tmp_path / "agent", fresh_crio, extra_config=cluster_config(cluster, node) + mirror
    )
    with agent:
        agent.wait_log("peer_reports_listening")  # the unit starts After=nodeagent.service
        command = [sys.executable, "-m", "nodeagent", "--config", str(agent.config_file)]
        log_path = tmp_path / "peer.log"
        with log_path.open("wb") as log:
            peer = subprocess.Popen(
                [*command, "serve-mirror"], stdout=log, stderr=log, env=agent.env(), cwd=tmp_path
            )
        try:
            wait_for(
                lambda: "node_mirror_started" in log_path.read_text(),
                timeout_s=30,
                what="the node mirror to listen",
                detail=lambda: log_tail(log_path),
            )
            agent.wait_log("node_mirror_reported")
            assert ask(port, f"/v2/team/app/blobs/{DIGEST}") == 404
            nis = wait_nis(
                cluster,
                node,
                lambda n: (
                    DIGEST in (n.get("status") or {}).get("nodeMirror", {}).get("recentMissing", [])
                ),
                what="nodeMirror reported",
                agent=agent,
            )
            reported = nis["status"]["nodeMirror"]
            assert reported["serving"] is True and reported["listen"] == f"127.0.0.1:{port}"
            assert reported["missing"] >= 1
        finally:
            peer.send_signal(signal.SIGTERM)
            assert peer.wait(timeout=30) == 0

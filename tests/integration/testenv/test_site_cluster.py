"""Site nodes in cluster mode: each node's daemon reaches the shared test API server.

The API server listens on the host's loopback; ``tests/testenv/ns_relay.py`` listens on
the same address inside each node namespace and relays, so the kubeconfig that names
``https://127.0.0.1:<port>`` works from every node, TLS end to end.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.testenv.site_helpers import started_network
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import get, install_deploy
from tests.testenv.ns_relay import KubeRelay
from tests.testenv.site_node import SiteNode
from tests.testenv.site_pki import make_ca
from tests.testenv.waiting import log_tail, wait_for

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_every_node_reports_to_the_shared_api_server_through_the_relay(
    kube: KubeCluster, tmp_path: Path
) -> None:
    install_deploy(kube)
    run = uuid.uuid4().hex[:8]
    ca = make_ca("site CA")
    with (
        started_network(2) as network,
        KubeRelay(kube.port, [h.netns for h in network.hosts], tmp_path / "relay.log"),
    ):
        names = [f"site-{run}-{h.index}" for h in network.hosts]
        for name in names:
            kube.create_node(name)
        nodes = [
            SiteNode(
                tmp_path / name,
                host,
                name=name,
                ca=ca,
                serve=False,
                with_crio=True,
                kubeconfig=kube.kubeconfig_for_node(name),
            )
            for name, host in zip(names, network.hosts, strict=True)
        ]
        try:
            for node in nodes:
                node.start()
            for node in nodes:
                found = wait_for(
                    functools.partial(reported, kube, node.name),
                    timeout_s=90,
                    what=f"{node.name}'s status object",
                    detail=functools.partial(log_tail, node.log_path),
                )
                assert found["status"]["nodeName"] == node.name
        finally:
            for node in nodes:
                node.close()


def reported(kube: KubeCluster, name: str) -> dict[str, Any] | None:
    """The node's NodeImageStatus once its status is written: the object is created first,
    and its status (a subresource) written by a second request."""
    found = get(kube, "nodeimagestatuses", name)
    return found if found is not None and "status" in found else None

"""Cluster mode: a node learns of a peer's bundle from its published holdings and fetches it.

Two store-only nodes (no CRI-O) in cluster mode against the shared test API server (through
``ns_relay``), with no static peers: node 0's store holds a signed bundle (copied by the
store's copier, as after a stick) and its agent publishes it in its NodeImageHoldings, at
the Node's InternalIP; node 1 follows (``follow = auto`` in cluster mode), is woken by the
watch, fetches the bundle from node 0 over mutual TLS, verifies it, and publishes it in
its own holdings as complete.
"""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.store.copier import copy_bundle
from tests.integration.testenv.site_helpers import create_addressed_nodes, started_network
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import get, install_deploy
from tests.testenv.ns_relay import KubeRelay
from tests.testenv.signed_bundles import Keys, image, signed_bundle
from tests.testenv.site_node import SiteNode
from tests.testenv.site_pki import make_ca
from tests.testenv.waiting import log_tail, wait_for

pytestmark = pytest.mark.integration

MIB = 1 << 20


def held(kube: KubeCluster, node: str, bundle_id: str) -> dict[str, Any] | None:
    found = get(kube, "nodeimageholdings", node)
    for entry in ((found or {}).get("spec") or {}).get("bundles") or []:
        if entry.get("bundleId") == bundle_id:
            return dict(entry)
    return None


@pytest.mark.timeout(240)
def test_a_node_fetches_what_a_peer_publishes_without_any_static_peer(
    kube: KubeCluster, tmp_path: Path
) -> None:
    install_deploy(kube)
    run = uuid.uuid4().hex[:8]
    bundle_id = f"site-cluster-{run}"
    keys = Keys.make(tmp_path / "keys")
    images = [image("site/app", [(MIB, 1), (2 * MIB, 2)], tmp_path / "layers")]
    bundle = signed_bundle(tmp_path / "stick", keys, images, bundle_id=bundle_id, set_name="s")
    public_key = (keys.trusted_dir / "factory.pub").read_text()
    ca = make_ca("site CA")
    with (
        started_network(2) as network,
        KubeRelay(kube.port, [h.netns for h in network.hosts], tmp_path / "relay.log"),
    ):
        names = [f"fetch-{run}-{h.index}" for h in network.hosts]
        create_addressed_nodes(kube, zip(names, network.hosts, strict=True))
        nodes = [
            SiteNode(
                tmp_path / name,
                host,
                name=name,
                ca=ca,
                trusted_keys=[public_key],
                kubeconfig=kube.kubeconfig_for_node(name),
            )
            for name, host in zip(names, network.hosts, strict=True)
        ]
        store = nodes[0].state_dir / "store"
        copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
        try:
            for node in nodes:
                node.start()
            source = wait_for(
                functools.partial(held, kube, names[0], bundle_id),
                timeout_s=90,
                what=f"{names[0]} publishing the bundle",
                detail=functools.partial(log_tail, nodes[0].log_path),
            )
            assert source["complete"] is True
            fetched = wait_for(
                lambda: (held(kube, names[1], bundle_id) or {}).get("complete") is True,
                timeout_s=120,
                what=f"{names[1]} fetching the bundle and publishing it complete",
                detail=functools.partial(log_tail, nodes[1].log_path),
            )
            assert fetched
            log = nodes[1].current_run_log()
            assert f"peers={network.hosts[0].address}:9447" in log
            assert "bundle_fetched:" in log
            assert (held(kube, names[1], bundle_id) or {})["manifestDigest"] == source[
                "manifestDigest"
            ]
        finally:
            for node in nodes:
                node.close()

"""A PinnedImageSet named with the API's longest name (253 characters), through the cluster cache.

The daemon keeps each cluster set in ``<state>/cluster/pinnedimagesets.d/<name>.yaml``; a
253-character name made that 258 bytes, beyond NAME_MAX (255), and the atomic write's temporary
name longer still. Real kube-apiserver, real CRI-O, the real daemon: the set is pinned and
reported under its full name, its cache file is hash-suffixed (``specs.file_stem``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.cluster.placement import cache_file_name
from tests.conftest import Pushed
from tests.integration.cluster.test_cluster_mode import is_complete, wait_nis
from tests.integration.pins.test_flow import pinned_flags
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import apply, cluster_config, install_deploy, pinned_image_set

pytestmark = pytest.mark.integration

SET_NAME = "edge-apps." + "a" * 60 + "." + "b" * 60 + "." + "c" * 60 + "." + "d" * 60


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    return kube


async def test_a_253_character_set_name_is_cached_pinned_and_reported(
    cluster: KubeCluster, fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    assert len(SET_NAME) == 253
    node = "edge-long-names-1"
    cluster.create_node(node)
    ref = pushed.ref(pushed.base_a)
    apply(cluster, pinned_image_set(SET_NAME, [ref], labels={"names": "long"}))
    agent = Agent(
        tmp_path / "agent",
        fresh_crio,
        extra_config=cluster_config(cluster, node, selector="names=long"),
    )
    try:
        with agent:
            wait_nis(cluster, node, is_complete(SET_NAME, 1), what="long set pinned", agent=agent)
            assert await pinned_flags(fresh_crio, [ref]) == {ref: True}
            cache = agent.state_dir / "cluster" / "pinnedimagesets.d"
            (cached,) = cache.glob("*.yaml")
            assert cached.name == cache_file_name(SET_NAME)
            assert len(cached.name.encode()) == 205  # 200 + '.yaml'
            assert f"name: {SET_NAME}" in cached.read_text()
    finally:
        cluster.kubectl("delete", "pinnedimageset", SET_NAME)
        cluster.kubectl("delete", "node", node, "--wait=false")

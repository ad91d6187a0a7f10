"""Pulls with the registry stopped, through the real pieces together (issue 25's tests).

The daemon's own drop-in, the peer process's node mirror and CRI-O's reading of the drop-in,
after every import has ended (conftest.py builds the node): the kubelet's CRI sequence for
``imagePullPolicy: Always`` by digest and by a signed served tag, an evicted image through
CRI, podman and skopeo, the OS image through skopeo and the image proxy rpm-ostree uses, and,
the node mirror killed, pulls that go on to the source once it is up.
"""

from __future__ import annotations

import json

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.errors import NodeAgentError
from tests.integration.bundles.test_node_mirror_dropin import served
from tests.integration.mirror.conftest import OfflineNode
from tests.testenv import pods
from tests.testenv.image_proxy import ImageProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_daemon_s_drop_in_sends_digests_and_the_signed_tag_to_the_node_mirror(
    offline_node: OfflineNode,
) -> None:
    # The imports have ended: their loopback mirror and its drop-in are gone; this one is
    # the daemon's, the only one in CRI-O's registries.conf.d.
    assert [p.name for p in offline_node.crio.registries_dir.iterdir()] == [
        offline_node.dropin.name
    ]
    text = offline_node.dropin.read_text()
    host = offline_node.registry.host
    for repository in ("nodeagent-test/app", "nodeagent-test/catalog", "ocp/rhel-coreos"):
        assert f'location = "{offline_node.mirror_host}/{repository}"' in text, text
    assert 'pull-from-mirror = "tag-only"' in text
    tagged = text.split('pull-from-mirror = "tag-only"')[0].rsplit("[[registry]]", 1)[1]
    assert f'prefix = "{host}/nodeagent-test/catalog"' in tagged  # only the served tag's


async def test_always_by_digest_and_by_served_tag_runs_pods_offline(
    offline_node: OfflineNode,
) -> None:
    n = offline_node
    async with CriClient(n.crio.endpoint, timeout_s=120) as cri, pods.Pods(n.crio.endpoint) as run:
        for image, pod in ((n.app, "app"), (n.tag_ref, "catalog")):
            # The kubelet asks first, then, Always, pulls whatever the answer. The tag is
            # not known to CRI-O yet: its bundle came when the store held its images, so
            # the import had nothing to pull (and no tag either).
            known = await cri.image_status(image)
            assert (known is not None) is (image == n.app)
            pulled = await cri.pull_image(image, timeout_s=120)
            if image == n.tag_ref:
                assert pulled == f"{n.registry.host}/nodeagent-test/catalog@{n.signed_digest}"
                assert await cri.image_status(image) is not None
            await run.run(image, pod=pod, namespace="offline")
        listed = await cri.list_containers()
        assert sorted(c.pod_name for c in listed) == ["app", "catalog"]


async def test_an_evicted_image_pulls_through_cri_podman_and_skopeo(
    offline_node: OfflineNode,
) -> None:
    n = offline_node
    async with CriClient(n.crio.endpoint, timeout_s=120) as cri:
        stored = await cri.image_status(n.evicted)
        assert stored is None or not stored.is_pinned
        await cri.remove_image(n.evicted)  # the kubelet's garbage collection
        assert await cri.image_status(n.evicted) is None
        await cri.pull_image(n.evicted, timeout_s=120)
        assert await cri.image_status(n.evicted) is not None
        await cri.remove_image(n.evicted)
    tools = n.tools("evicted-tools")
    pulled = tools.run("podman", "pull", "-q", n.evicted)
    assert pulled.returncode == 0, pulled.stderr
    async with CriClient(n.crio.endpoint, timeout_s=120) as cri:
        assert await cri.image_status(n.evicted) is not None  # in CRI-O's storage again
    out = tools.base / "oci"
    copied = tools.run("skopeo", "copy", "--quiet", f"docker://{n.evicted}", f"oci:{out}:e")
    assert copied.returncode == 0, copied.stderr
    (descriptor,) = json.loads((out / "index.json").read_text())["manifests"]
    assert descriptor["digest"] == n.evicted.split("@")[1]  # the very manifest, unchanged


async def test_the_os_image_removed_from_containers_storage_comes_through_the_node_mirror(
    offline_node: OfflineNode,
) -> None:
    n, os_image = offline_node, offline_node.release.os_image
    async with CriClient(n.crio.endpoint, timeout_s=120) as cri:
        await cri.remove_image(os_image)
        assert await cri.image_status(os_image) is None
    tools = n.tools("os-tools")
    listed = tools.run("podman", "images", "--format=json", "--filter", f"reference={os_image}")
    assert listed.returncode == 0 and json.loads(listed.stdout or "[]") == [], listed.stdout
    out = tools.base / "oci"
    copied = tools.run("skopeo", "copy", "--quiet", f"docker://{os_image}", f"oci:{out}:os")
    assert copied.returncode == 0, copied.stderr
    manifests = n.release.os_image_index
    assert manifests is not None
    (descriptor,) = json.loads((out / "index.json").read_text())["manifests"]
    assert descriptor["digest"] == manifests["amd64"]  # the node's instance, as signed
    command = tools.command
    with ImageProxy(
        lambda fd: command(["skopeo", "experimental-image-proxy", "--sockfd", str(fd)]),
        env=tools.env(),
    ) as proxy:
        proxy.initialize()
        handle = proxy.open_image(f"docker://{os_image}")
        digest, raw = proxy.get_manifest(handle)
        proxy.close_image(handle)
        assert proxy.close() == 0
    assert digest == manifests["amd64"]
    configs = n.release.os_image_configs or {}
    assert json.loads(raw)["config"]["digest"] == configs["amd64"]


async def test_the_node_mirror_killed_pulls_go_to_the_source(offline_node: OfflineNode) -> None:
    """Last in the module: it kills the mirror. A pull that succeeded through it fails once
    it is killed while the registry is down too, and succeeds from the source once it is up."""
    n = offline_node
    async with CriClient(n.crio.endpoint, timeout_s=120) as cri:
        await cri.remove_image(n.app)
        await cri.pull_image(n.app, timeout_s=120)  # the node mirror up: it serves
    # The peer process counted what it served and reported it (each 15 s).
    status = n.agent.wait_status(
        lambda s: (s.get("nodeMirror") or {}).get("requests", 0) > 0,
        what="the node mirror's requests in the status", timeout_s=40,
    )  # fmt: skip
    assert status["nodeMirror"]["serving"] is True and status["nodeMirror"]["bytesServed"] > 0
    n.kill_mirror()
    async with CriClient(n.crio.endpoint, timeout_s=120) as cri:
        await cri.remove_image(n.app)
        with pytest.raises(NodeAgentError):
            await cri.pull_image(n.app, timeout_s=120)
        with n.registry:
            before = served(n.registry, "nodeagent-test/app")
            await cri.pull_image(n.app, timeout_s=120)
            assert served(n.registry, "nodeagent-test/app") > before
        assert await cri.image_status(n.app) is not None

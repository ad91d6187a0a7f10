"""Registry pulls wait for a healthy Node and keep a control plane's pace, against a real
kube-apiserver (the test patches the Node's conditions as a kubelet would), a real CRI-O and
a real registry; the pause between pulls is measured in CRI-O. Bundle imports are not held."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.bundles import minisign
from tests.conftest import Pushed
from tests.integration.pins.test_flow import pinned_flags
from tests.testenv.agent import Agent
from tests.testenv.bundles import make_bundle
from tests.testenv.crio import Crio
from tests.testenv.images import LayerSpec, TestImage, make_image_set, push
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import (
    apply,
    cluster_config,
    get,
    install_deploy,
    pinned_image_set,
    set_entry,
)
from tests.testenv.registry import Registry
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration

WORKER = {"node-role.kubernetes.io/worker": ""}
MASTER = {"node-role.kubernetes.io/master": "", "node-role.kubernetes.io/control-plane": ""}
PAUSE_S = 2.0


@pytest.fixture
def cluster(kube: KubeCluster) -> Iterator[KubeCluster]:
    install_deploy(kube)
    yield kube


def set_conditions(kube: KubeCluster, node: str, **statuses: str) -> None:
    """Patch the Node's status conditions as its kubelet would report them."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [
        {"type": kind, "status": status, "reason": f"Test{kind}{status}", "message": "test",
         "lastHeartbeatTime": now, "lastTransitionTime": now}
        for kind, status in statuses.items()
    ]  # fmt: skip
    patch = json.dumps({"status": {"conditions": conditions}})
    kube.kubectl_ok("patch", "node", node, "--subresource=status", "--type=merge", "-p", patch)


def wait_failed_reason(kube: KubeCluster, node: str, agent: Agent, reason: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        if agent.process is not None and agent.process.poll() is not None:
            raise AssertionError(f"nodeagent exited\n{agent.log_text()[-4000:]}")
        entry = set_entry(get(kube, "nodeimagestatuses", node), "apps")
        failed = (entry or {}).get("failedImages") or []
        return entry if failed and all(f["reason"] == reason for f in failed) else None

    return wait_for(
        probe, timeout_s=60, what=f"images held with {reason}",
        detail=lambda: f"{get(kube, 'nodeimagestatuses', node)}\n{agent.log_text()[-4000:]}",
    )  # fmt: skip


async def test_registry_pulls_wait_while_not_ready_or_under_disk_pressure(
    cluster: KubeCluster, fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    kube, node = cluster, "held-pulls-1"
    kube.create_node(node, WORKER)
    set_conditions(kube, node, Ready="False", DiskPressure="False")
    a, b = pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)
    apply(kube, pinned_image_set("apps", [a, b]))
    agent = Agent(tmp_path / "agent", fresh_crio, extra_config=cluster_config(kube, node))
    try:
        with agent:
            entry = wait_failed_reason(kube, node, agent, "NodeNotReady")
            assert (
                "is not Ready (Ready=False, TestReadyFalse)"
                in (entry["failedImages"][0]["message"])
            )
            assert await pinned_flags(fresh_crio, [a, b]) == {a: None, b: None}
            assert "registry_pulls_held" in agent.log_text()

            set_conditions(kube, node, Ready="True", DiskPressure="True")
            wait_failed_reason(kube, node, agent, "NodeDiskPressure")
            assert await pinned_flags(fresh_crio, [a, b]) == {a: None, b: None}

            set_conditions(kube, node, Ready="True", DiskPressure="False")
            wait_for(
                lambda: (set_entry(get(kube, "nodeimagestatuses", node), "apps") or {}).get(
                    "currentGeneration"
                ),
                timeout_s=60,
                what="apps pinned once the Node is healthy",
                detail=lambda: agent.log_text()[-4000:],
            )
            assert await pinned_flags(fresh_crio, [a, b]) == {a: True, b: True}
            assert "registry_pulls_resumed" in agent.log_text()
    finally:
        kube.kubectl("delete", "--ignore-not-found", "pinnedimageset", "apps")
        kube.kubectl("delete", "--ignore-not-found", "node", node)


async def appearances(crio: Crio, refs: list[str], timeout_s: float) -> dict[str, float]:
    """When each image first appears in CRI-O (monotonic seconds), polled every 20 ms."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    async with CriClient(crio.endpoint) as cri:
        while len(seen) < len(refs):
            if time.monotonic() > deadline:
                raise AssertionError(f"only {sorted(seen)} of {refs} appeared")
            for ref in refs:
                if ref not in seen and await cri.image_status(ref) is not None:
                    seen[ref] = time.monotonic()
            await asyncio.sleep(0.02)
    return seen


def three_images(registry: Registry, tag: str) -> list[str]:
    refs = []
    for seed in range(3):
        layers = [LayerSpec(48 * 1024, seed=seed + 40)]
        image = TestImage(f"nodeagent-test/paced-{tag}-{seed}", layers).build()
        refs.append(push(registry.url, image.repository, image).reference(registry.host))
    return refs


@pytest.mark.parametrize(("labels", "is_paced"), [(MASTER, True), (WORKER, False)])
async def test_a_control_plane_pulls_one_image_at_a_time_with_a_pause(
    cluster: KubeCluster,
    fresh_crio: Crio,
    registry: Registry,
    tmp_path: Path,
    *,
    labels: dict[str, str],
    is_paced: bool,
) -> None:
    kube = cluster
    node = "paced-cp-1" if is_paced else "paced-worker-1"
    kube.create_node(node, labels)
    set_conditions(kube, node, Ready="True", DiskPressure="False")
    refs = three_images(registry, node)
    apply(kube, pinned_image_set("paced", refs))
    config = cluster_config(kube, node) + f"control_plane_pull_pause_s = {PAUSE_S}\n"
    agent = Agent(tmp_path / "agent", fresh_crio, extra_config=config)
    try:
        with agent:
            seen = await appearances(fresh_crio, refs, timeout_s=90)
        times = sorted(seen.values())
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        print(f"{node}: gaps between images appearing in CRI-O {[round(g, 2) for g in gaps]}")
        if is_paced:
            assert all(gap >= PAUSE_S - 0.1 for gap in gaps), gaps
            assert "registry_pull_pace" in agent.log_text()
        else:
            assert times[-1] - times[0] < PAUSE_S, gaps  # in parallel, no pause
    finally:
        kube.kubectl("delete", "--ignore-not-found", "pinnedimageset", "paced")
        kube.kubectl("delete", "--ignore-not-found", "node", node)


async def test_a_bundle_is_imported_and_restored_on_a_node_that_is_not_ready(
    cluster: KubeCluster, fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    """Bundle imports and restores from the node's store are never held by the Node's terms:
    after a power cut a node is often NotReady exactly because its images are gone. The
    bundle is imported (``nodeagent bundle import``, cluster mode on) while the Node says
    Ready=False, and its set stays pinned in the daemon's syncs while the registry set beside
    it is held; CRI-O then loses its storage and the image is restored from the store."""
    kube, node, bundle_set = cluster, "held-pulls-bundle", "from-the-stick"
    kube.create_node(node, WORKER)
    set_conditions(kube, node, Ready="False", DiskPressure="False")
    a = pushed.ref(pushed.base_a)
    apply(kube, pinned_image_set("apps", [a]))
    public, secret = minisign.generate_keypair(comment="not ready")
    work = tmp_path / "factory"
    work.mkdir()
    with Registry(work / "registry") as factory:
        (image,) = make_image_set(
            1, layer_size_bytes=64 << 10, shared_base_size_bytes=16 << 10, seed=9
        )
        carried = push(factory.url, image.repository, image.build()).reference(factory.host)
        bundle = make_bundle(work, factory, [carried], public, secret, set_name=bundle_set)
    agent = Agent(tmp_path / "agent", fresh_crio, extra_config=cluster_config(kube, node))
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(public)
    try:
        imported = agent.cli("bundle", "import", str(bundle), "--json")
        assert imported.returncode == 0, imported.stdout + imported.stderr
        report = json.loads(imported.stdout[imported.stdout.index("{") :])
        assert report["state"] == "imported" and report["pinnedImageSets"] == [bundle_set]
        with agent:
            wait_failed_reason(kube, node, agent, "NodeNotReady")
            entry = set_entry(get(kube, "nodeimagestatuses", node), bundle_set)
            assert entry is not None and not entry.get("failedImages"), entry
            assert await pinned_flags(fresh_crio, [carried, a]) == {carried: True, a: None}

            # A power cut takes the runtime's storage: the image comes back from the node's
            # store while the Node still says Ready=False; the registry set stays held.
            fresh_crio.kill()
            shutil.rmtree(fresh_crio.storage_root)
            fresh_crio.start()
            agent.wait_status(
                lambda s: (
                    (s.get("imageLoss") or {}).get("restoredFromStore") == 1
                    and (s.get("imageLoss") or {}).get("resolved") is True
                ),
                what="the bundle's image back from the node's store",
                timeout_s=120,
            )
            assert await pinned_flags(fresh_crio, [carried, a]) == {carried: True, a: None}
            assert "images_restored_from_store" in agent.current_run_log()
    finally:
        kube.kubectl("delete", "--ignore-not-found", "pinnedimageset", "apps")
        kube.kubectl("delete", "--ignore-not-found", "node", node)

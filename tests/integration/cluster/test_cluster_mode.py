"""Cluster mode against a real kube-apiserver and a real CRI-O.

Each test runs the real daemon with the node identity (``system:node:<name>``
client certificate) that a kubelet has, and the RBAC and admission policy of
deploy/. Node names differ per test, so the session's API server is shared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Pushed
from tests.integration.pins.test_flow import pinned_flags
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import (
    apply,
    cluster_config,
    condition,
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

EDGE_ROLE = {"node-role.kubernetes.io/edge": ""}


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> KubeCluster:
    install_deploy(kube)
    return kube


@pytest.fixture
def mco(cluster: KubeCluster) -> Iterator[KubeCluster]:
    """The MachineConfigPool and MachineConfigNode APIs exist for the test, then go."""
    install_mco(cluster)
    yield cluster
    remove_mco(cluster)


def wait_nis(
    kube: KubeCluster, node: str, check: Any, *, what: str, agent: Agent, timeout_s: float = 90
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        if agent.process is not None and agent.process.poll() is not None:
            raise AssertionError(f"nodeagent exited\n{agent.log_text()[-4000:]}")
        nis = get(kube, "nodeimagestatuses", node)
        return nis if nis is not None and check(nis) else None

    return wait_for(
        probe,
        timeout_s=timeout_s,
        what=what,
        detail=lambda: f"{get(kube, 'nodeimagestatuses', node)}\n{agent.log_text()[-4000:]}",
    )


def is_complete(name: str, generation: int) -> Any:
    def check(nis: dict[str, Any]) -> bool:
        entry = set_entry(nis, name)
        ready = condition(nis, "Ready")
        return (
            entry is not None
            and entry.get("currentGeneration") == generation
            and entry["desiredGeneration"] == generation
            and ready is not None
            and ready["status"] == "True"
        )

    return check


async def test_pool_set_is_pinned_edited_and_unpinned_with_status_and_events(
    mco: KubeCluster, fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    kube = mco
    node = "edge-pools-1"
    created = kube.create_node(node, {**EDGE_ROLE, "node-role.kubernetes.io/worker": ""})
    metadata = created["metadata"]
    assert isinstance(metadata, dict)
    uid = str(metadata["uid"])
    a, b = pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)
    apply(kube, pinned_image_set("edge-apps", [a]))
    apply(kube, pinned_image_set("master-only", [b]))
    apply(kube, pool("edge", EDGE_ROLE, ["edge-apps", "not-created-yet"]))
    apply(kube, pool("master", {"node-role.kubernetes.io/master": ""}, ["master-only"]))
    apply(kube, machine_config_node(node, "edge"))

    agent = Agent(
        tmp_path / "agent", fresh_crio, extra_config=cluster_config(kube, node, mirror_mcn=True)
    )
    with agent:
        nis = wait_nis(
            kube, node, is_complete("edge-apps", 1), what="edge-apps pinned", agent=agent
        )
        assert await pinned_flags(fresh_crio, [a, b]) == {a: True, b: None}
        status = nis["status"]
        assert set_entry(nis, "master-only") is None
        assert status["placement"] == {
            "mode": "pools", "pools": ["edge"], "missingSets": ["not-created-yet"],
        }  # fmt: skip
        assert status["images"]["pinned"] == 1
        assert status["runtime"].startswith("cri-o")
        assert nis["metadata"]["ownerReferences"][0] == {
            "apiVersion": "v1", "kind": "Node", "name": node, "uid": uid,
        }  # fmt: skip
        managers = {m["manager"] for m in nis["metadata"]["managedFields"]}
        assert managers == {"nodeagent"}

        # Discovery is on ([site] follow = auto in cluster mode): its holdings, empty store.
        held = wait_for(
            lambda: get(kube, "nodeimageholdings", node), timeout_s=30,
            what="the node's holdings published", detail=lambda: agent.log_text()[-4000:],
        )  # fmt: skip
        assert held["spec"] == {
            "nodeName": node, "serving": False, "bundleCount": 0, "bundles": [],
        }  # fmt: skip
        assert held["metadata"]["ownerReferences"][0]["uid"] == uid

        table = kube.kubectl_ok("get", "nodeimagestatuses", node)
        header, row = table.splitlines()[:2]
        assert header.split()[:6] == ["NAME", "READY", "REASON", "PINNED", "IMAGES", "PULLING"]
        assert row.split()[:5] == [node, "True", "AllPinned", "1", "1"]

        events = json.loads(kube.kubectl_ok(
            "get", "events", "-n", "default", "-o", "json",
            f"--field-selector=involvedObject.name={node},reason=PinnedImageSetPinned",
        ))["items"]  # fmt: skip
        assert any("edge-apps generation 1" in e["message"] for e in events)

        mcn = get(kube, "machineconfignodes", node)
        assert mcn is not None
        mirrored = {s["name"]: s for s in mcn["status"]["pinnedImageSets"]}
        assert mirrored["edge-apps"]["currentGeneration"] == 1
        kinds = {c["type"]: (c["status"], c["reason"], c["message"])
                 for c in mcn["status"]["conditions"]}  # fmt: skip
        assert kinds == {
            "PinnedImageSetsProgressing": ("False", "AsExpected", "All pinned image sets complete"),
            "PinnedImageSetsDegraded": ("False", "AsExpected", "All is good"),
        }  # the machine-config-daemon's words

        # Edit: a second image -> generation 2 -> both pinned.
        apply(kube, pinned_image_set("edge-apps", [a, b]))
        nis = wait_nis(kube, node, is_complete("edge-apps", 2), what="generation 2", agent=agent)
        assert await pinned_flags(fresh_crio, [a, b]) == {a: True, b: True}
        assert nis["status"]["images"]["pinned"] == 2

        # The pool drops the set: unpinned, gone from the status object; images stay.
        apply(kube, pool("edge", EDGE_ROLE, []))
        wait_nis(
            kube, node, lambda n: set_entry(n, "edge-apps") is None, what="set gone", agent=agent
        )
        assert await pinned_flags(fresh_crio, [a, b]) == {a: False, b: False}
    kube.kubectl_ok("delete", "pinnedimageset", "edge-apps", "master-only")


async def test_selector_mode_and_deleting_a_set_unpins_it(
    cluster: KubeCluster, fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    kube = cluster
    assert (
        kube.kubectl(
            "get", "crd", "machineconfigpools.machineconfiguration.openshift.io"
        ).returncode
        != 0
    )
    node = "edge-selector-1"
    kube.create_node(node)
    a, b = pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)
    apply(kube, pinned_image_set("ship-apps", [a], labels={"site": "ship"}))
    apply(kube, pinned_image_set("shop-apps", [b], labels={"site": "shop"}))
    agent = Agent(
        tmp_path / "agent",
        fresh_crio,
        extra_config=cluster_config(kube, node, selector="site=ship"),
    )
    with agent:
        nis = wait_nis(
            kube, node, is_complete("ship-apps", 1), what="ship-apps pinned", agent=agent
        )
        assert set_entry(nis, "shop-apps") is None
        assert nis["status"]["placement"] == {"mode": "selector", "pools": []}
        assert await pinned_flags(fresh_crio, [a, b]) == {a: True, b: None}

        kube.kubectl_ok("delete", "pinnedimageset", "ship-apps")
        wait_nis(
            kube, node, lambda n: set_entry(n, "ship-apps") is None, what="unpinned", agent=agent
        )
        assert await pinned_flags(fresh_crio, [a]) == {a: False}
        assert not (agent.state_dir / "cluster" / "pinnedimagesets.d" / "ship-apps.yaml").exists()
    kube.kubectl_ok("delete", "pinnedimageset", "shop-apps")


def test_invalid_sets_are_rejected_by_the_crd(cluster: KubeCluster, pushed: Pushed) -> None:
    good = pushed.ref(pushed.base_a)
    digest = good.rpartition("@")[2]
    cases = {
        "tag": (f"{pushed.host}/nodeagent-test/app-a:latest", "sha256"),
        "no-dot-host": (
            f"registry:5000/app@{digest}",
            "host[:port]/[namespace/]name".replace("/[namespace/]", "[/namespace]/"),
        ),
        "two-namespaces": (f"{pushed.host}/a/b/c@{digest}", "[/namespace]"),
        "short-digest": (f"{pushed.host}/app@sha256:abc", "64 characters long"),
    }
    for name, (ref, hint) in cases.items():
        result = cluster.kubectl(
            "apply", "-f", "-", input=json.dumps(pinned_image_set(f"bad-{name}", [ref]))
        )
        assert result.returncode != 0, f"{name}: {ref} was accepted"
        assert "Invalid" in result.stderr and hint in result.stderr, result.stderr
    empty = pinned_image_set("bad-empty", [])
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(empty))
    assert result.returncode != 0
    assert "should have at least 1 items" in result.stderr
    duplicate = pinned_image_set("bad-duplicate", [good, good])
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(duplicate))
    assert result.returncode != 0
    assert "Duplicate value" in result.stderr


def test_a_node_cannot_write_another_nodes_status(cluster: KubeCluster) -> None:
    kube = cluster
    for name in ("node-a", "node-b"):
        kube.create_node(name)
    as_a = kube.kubeconfig_for_node("node-a")
    own = {"apiVersion": "nodeagent.io/v1alpha1", "kind": "NodeImageStatus",
           "metadata": {"name": "node-a"}, "spec": {"nodeName": "node-a"}}  # fmt: skip
    apply(kube, own, kubeconfig=as_a)
    apply(kube, {**own, "metadata": {"name": "node-b"}, "spec": {"nodeName": "node-b"}})

    other = {**own, "metadata": {"name": "node-b"}, "spec": {"nodeName": "node-b"}}
    result = kube.kubectl(
        "apply", "--server-side", "-f", "-", kubeconfig=as_a, input=json.dumps(other)
    )
    assert result.returncode != 0
    assert "system:node:node-a may only write the object named after its own node" in result.stderr

    patch = json.dumps({"status": {"nodeName": "forged"}})
    result = kube.kubectl(
        "patch", "nodeimagestatus", "node-b", "--subresource=status", "--type=merge", "-p", patch,
        kubeconfig=as_a,
    )  # fmt: skip
    assert result.returncode != 0
    assert "may only write the object named after its own node" in result.stderr
    result = kube.kubectl("delete", "nodeimagestatus", "node-b", kubeconfig=as_a)
    assert result.returncode != 0
    assert "forbidden" in result.stderr.lower()

    result = kube.kubectl(
        "patch", "nodeimagestatus", "node-a", "--subresource=status", "--type=merge", "-p",
        json.dumps({"status": {"nodeName": "node-a"}}), kubeconfig=as_a,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    forged = {**own, "spec": {"nodeName": "node-b"}}
    result = kube.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        kubeconfig=as_a,
        input=json.dumps(forged),
    )
    assert result.returncode != 0
    assert "spec.nodeName must be the object's own name" in result.stderr
    nis_b = get(kube, "nodeimagestatuses", "node-b")
    assert nis_b is not None and "status" not in nis_b


@pytest.mark.timeout(240)  # 35 s here: waits out the daemon's retries while the API is down
async def test_api_server_down_mid_sync_pins_converge_and_status_catches_up(
    cluster: KubeCluster, fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    kube = cluster
    node = "edge-outage-1"
    kube.create_node(node)
    a = pushed.ref(pushed.base_a)
    b = pushed.ref(pushed.base_b)
    apply(kube, pinned_image_set("outage-apps", [a], labels={"test": "outage"}))
    config = cluster_config(kube, node, selector="test=outage")
    agent = Agent(tmp_path / "agent", fresh_crio, extra_config=config)
    cache = agent.state_dir / "cluster" / "pinnedimagesets.d" / "outage-apps.yaml"
    with agent:
        wait_nis(kube, node, is_complete("outage-apps", 1), what="first generation", agent=agent)
        apply(kube, pinned_image_set("outage-apps", [a, b], labels={"test": "outage"}))
        wait_for(lambda: b in cache.read_text(), timeout_s=60, what="new generation cached")
        kube.stop_apiserver()
        try:
            agent.wait_status(
                lambda s: (
                    set_state(s, "outage-apps") == "Pinned"
                    and s["pinnedImageSets"][0]["currentGeneration"] == 2
                ),
                what="generation 2 pinned while the API server is down",
            )
            assert await pinned_flags(fresh_crio, [a, b]) == {a: True, b: True}
            agent.wait_log("api_unreachable")
        finally:
            kube.start_apiserver()
        wait_nis(kube, node, is_complete("outage-apps", 2), what="status caught up", agent=agent)
        agent.wait_log("api_reachable")
    # A restart while the API server is down still works from the last known specs.
    kube.stop_apiserver()
    try:
        with agent:
            agent.wait_status(
                lambda s: set_state(s, "outage-apps") == "Pinned", what="pinned from the cache"
            )
    finally:
        kube.start_apiserver()
    kube.kubectl_ok("delete", "pinnedimageset", "outage-apps")

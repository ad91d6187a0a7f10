"""A compromised node tries to open the upgrade gate for the whole site.

The gate (deploy/upgrade-gate.yaml) trusts every node's NodeImageStatus for that node only.
The attacker holds one node's valid identity (``system:node:edge-evil`` in ``system:nodes``)
with deploy/'s RBAC and admission policy as shipped, and tries, against the real
kube-apiserver: to say another node pinned the release (its status, or a new object in its
name), to take another node (or itself) out of the gate's params by deleting a status, to
write a release entry of another shape, and to set ClusterVersion's target itself. Each must
be refused, and the gate must still refuse the target, naming the honest node that has not
pinned it. About 4 s with the API server running.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testenv.cvo import CvoStandIn, install_crd, release_image
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import DEPLOY, install_deploy
from tests.testenv.waiting import wait_for

HONEST, EVIL = "edge-honest", "edge-evil"
TARGET = "sha256:" + "7" * 64
GATE = DEPLOY / "upgrade-gate.yaml"


def entry(pinned: bool, digest: str = TARGET) -> dict[str, Any]:
    return {"digest": digest, "version": "4.16.5", "set": "release-4.16.5", "pinned": pinned}


def status_body(kube: KubeCluster, node: str, releases: list[dict[str, Any]]) -> str:
    obj = json.loads(kube.kubectl_ok("get", "nis", node, "-o", "json"))
    obj["status"] = {"nodeName": node, "releases": releases}
    return json.dumps(obj)


@pytest.fixture(scope="module")
def evil(kube: KubeCluster) -> Iterator[Path]:
    install_deploy(kube)
    install_crd(kube)
    # every NodeImageStatus is a param of the gate: none left by another module
    kube.kubectl_ok("delete", "nis", "--all", "--wait")
    CvoStandIn(kube).install("4.16.3", release_image("sha256:" + "3" * 64))
    for node in (HONEST, EVIL):
        kube.create_node(node)
        body = {"apiVersion": "nodeagent.io/v1alpha1", "kind": "NodeImageStatus",
                "metadata": {"name": node}, "spec": {"nodeName": node}}  # fmt: skip
        kube.kubectl_ok("apply", "--server-side", "-f", "-", input=json.dumps(body))
        kube.kubectl_ok(
            "replace", "--subresource=status", "-f", "-",
            input=status_body(kube, node, [entry(pinned=node == EVIL)]),
        )  # fmt: skip
    kube.kubectl_ok("apply", "--server-side", "-f", str(GATE))
    yield kube.kubeconfig_for_node(EVIL)
    kube.kubectl("delete", "--ignore-not-found", "-f", str(GATE))
    kube.kubectl("delete", "--ignore-not-found", "nis", HONEST, EVIL)
    kube.kubectl("delete", "--ignore-not-found", "node", HONEST, EVIL)
    kube.kubectl("delete", "--ignore-not-found", "clusterversion", "version")


def honest_releases(kube: KubeCluster) -> Any:
    return json.loads(kube.kubectl_ok("get", "nis", HONEST, "-o", "json"))["status"]["releases"]


def test_another_nodes_status_cannot_be_written(kube: KubeCluster, evil: Path) -> None:
    forged = status_body(kube, HONEST, [entry(pinned=True)])
    result = kube.kubectl("replace", "--subresource=status", "-f", "-", kubeconfig=evil,
                          input=forged)  # fmt: skip
    assert result.returncode != 0 and "may only write the object named after" in result.stderr
    patch = json.dumps({"status": {"releases": [entry(pinned=True)]}})
    result = kube.kubectl(
        "patch", "nis", HONEST, "--subresource=status", "--type=merge", "-p", patch,
        kubeconfig=evil,
    )  # fmt: skip
    assert result.returncode != 0
    assert honest_releases(kube) == [entry(pinned=False)]


def test_no_status_can_be_deleted_or_made_in_another_name(kube: KubeCluster, evil: Path) -> None:
    for node in (HONEST, EVIL):
        deleted = kube.kubectl("delete", "nis", node, kubeconfig=evil)
        assert deleted.returncode != 0 and "forbidden" in deleted.stderr.lower(), deleted.stderr
    body = {"apiVersion": "nodeagent.io/v1alpha1", "kind": "NodeImageStatus",
            "metadata": {"name": "edge-phantom"}, "spec": {"nodeName": "edge-phantom"}}  # fmt: skip
    made = kube.kubectl("create", "-f", "-", kubeconfig=evil, input=json.dumps(body))
    assert made.returncode != 0


def test_a_release_entry_of_another_shape_is_refused(kube: KubeCluster, evil: Path) -> None:
    for bad in (entry(True, "sha256:ABC"), entry(True, TARGET + "\n"), {"digest": TARGET}):
        result = kube.kubectl(
            "replace", "--subresource=status", "-f", "-", kubeconfig=evil,
            input=status_body(kube, EVIL, [bad]),
        )  # fmt: skip
        assert result.returncode != 0, bad


def stray_statuses(kube: KubeCluster) -> list[str]:
    """NodeImageStatus objects of nodes not in this module: every one is a param of the gate,
    and a stray without the release is named in the refusal instead of the honest node."""
    names = kube.kubectl_ok("get", "nis", "-o", "jsonpath={.items[*].metadata.name}").split()
    return sorted(set(names) - {HONEST, EVIL})


def test_the_node_cannot_set_the_target_and_the_gate_still_names_the_honest_node(
    kube: KubeCluster, evil: Path
) -> None:
    patch = json.dumps({"spec": {"desiredUpdate": {"image": release_image(TARGET), "force": True}}})
    by_node = kube.kubectl("patch", "clusterversion", "version", "--type=merge", "-p", patch,
                           kubeconfig=evil)  # fmt: skip
    assert by_node.returncode != 0 and "forbidden" in by_node.stderr.lower()
    seen: dict[str, object] = {"strays": []}

    def refused_naming_the_honest_node() -> bool:
        # Once in the whole make-test session (one API server for every module) the refusal
        # did not name the honest node within 30 s: a status another module left behind is
        # the likely cause. Strays are removed and named if the wait fails.
        if strays := stray_statuses(kube):
            seen["strays"] = [*seen["strays"], *strays]  # type: ignore[misc]
            kube.kubectl("delete", "--ignore-not-found", "nis", *strays)
        answer = kube.kubectl("patch", "clusterversion", "version", "--type=merge", "-p", patch)
        seen["answer"] = (answer.returncode, answer.stderr.strip()[-600:])
        return f"node {HONEST} has not pinned release {TARGET}" in answer.stderr

    wait_for(
        refused_naming_the_honest_node,
        timeout_s=30,
        what="the gate refusing the admin's target, naming the honest node",
        detail=lambda: f"strays removed {seen['strays']}; last answer {seen.get('answer')}",
    )

"""A node identity that may start the upgrade tries to do more (deploy/opt-in/upgrade-start.yaml).

The one-touch upgrade lets nodes update ClusterVersion. The attacker holds a node's valid
client certificate (``system:node:<name>`` in ``system:nodes``) on a cluster where the admin
applied the opt-in as docs/upgrade.md says (admission first). Against the real kube-apiserver
with openshift/api's ClusterVersion CRD and deploy/crds' NodeImageStatus, the node tries:
``force: true`` on a pinned release (the CVO would skip the signature checks), a release some
node has not pinned, a release by tag, another spec field (channel, upstream), a label,
deleting ClusterVersion, writing its status. Each is refused by the policy (or RBAC) and
ClusterVersion is as it was. The good change (a release every NodeImageStatus lists pinned,
by digest) passes; with no NodeImageStatus at all a node's change is refused, an admin's
never is. About 8 s with the API server running.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.kube import KubeApi
from nodeagent.cluster.kinds import CLUSTER_VERSION
from nodeagent.errors import NodeAgentError
from tests.testenv.cvo import CvoStandIn, install_crd, release_image
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import DEPLOY, install_deploy
from tests.testenv.waiting import wait_for, wait_for_async

pytestmark = pytest.mark.integration

OPT_IN = DEPLOY / "opt-in" / "upgrade-start.yaml"
POLICY = "nodeagent-node-upgrade-start-only"
PINNED_POLICY = "nodeagent-node-upgrade-start-pinned"
ADMISSION = "app.kubernetes.io/component=admission"
OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
HALF = "sha256:" + "c" * 64
"""Pinned on edge-1 only."""
NODES = ("edge-1", "edge-2")


@dataclass(frozen=True)
class Cluster:
    kube: KubeCluster
    cvo: CvoStandIn
    node: Path


def publish(kube: KubeCluster, node: str, pinned: list[str]) -> None:
    body = {
        "apiVersion": "nodeagent.io/v1alpha1",
        "kind": "NodeImageStatus",
        "metadata": {"name": node},
        "spec": {"nodeName": node},
    }
    kube.kubectl_ok("apply", "--server-side", "-f", "-", input=json.dumps(body))
    obj = json.loads(kube.kubectl_ok("get", "nis", node, "-o", "json"))
    releases = [
        {"digest": d, "version": f"4.17.{n}", "set": f"release-4.17.{n}", "pinned": True}
        for n, d in enumerate(pinned)
    ]
    obj["status"] = {"nodeName": node, "releases": releases}
    kube.kubectl_ok("replace", "--subresource=status", "-f", "-", input=json.dumps(obj))


def _install_as_documented(kube: KubeCluster) -> None:
    kube.kubectl_ok("apply", "--server-side", "-f", str(OPT_IN), "-l", ADMISSION)

    last: list[str] = [""]

    def refused() -> str | None:
        probe = kube.kubectl(
            "patch", "clusterversion", "version", "--type=merge", "--dry-run=server",
            "-p", '{"spec":{"channel":"probe"}}',
            "--as=system:node:probe", "--as-group=system:nodes", "--as-group=system:masters",
        )  # fmt: skip
        last[0] = probe.stderr
        return probe.stderr if POLICY in probe.stderr else None

    wait_for(
        refused, timeout_s=30, interval_s=0.1, what="the policy in force", detail=lambda: last[0]
    )
    kube.kubectl_ok("apply", "--server-side", "-f", str(OPT_IN))


@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> Iterator[Cluster]:
    install_deploy(kube)
    install_crd(kube)
    cvo = CvoStandIn(kube)
    cvo.install("4.16.3", release_image(OLD), channel="stable-4.17")
    # Every NodeImageStatus is a param of the pinned rule: none left by another module.
    kube.kubectl_ok("delete", "nis", "--all", "--ignore-not-found")
    for node in NODES:
        kube.create_node(node)
    publish(kube, "edge-1", [NEW, HALF])
    publish(kube, "edge-2", [NEW])
    _install_as_documented(kube)
    yield Cluster(kube, cvo, kube.kubeconfig_for_node("edge-1"))
    # --wait=false: no namespace controller runs here to finish the namespace's deletion.
    kube.kubectl(
        "delete", "--wait=false", "-f", str(OPT_IN), "-l", "app.kubernetes.io/component=rbac"
    )
    kube.kubectl("delete", "-f", str(OPT_IN), "-l", ADMISSION)
    kube.kubectl("delete", "nis", *NODES, "--ignore-not-found")
    kube.kubectl("delete", "node", *NODES, "--ignore-not-found")
    kube.kubectl("delete", "clusterversion", "version", "--ignore-not-found")


async def patched_by(kubeconfig: Path, patch: dict[str, Any]) -> str:
    """The API server's refusal of a JSON merge patch of ClusterVersion, "" when admitted."""
    api = KubeApi(kubeconfig, timeout_s=10, field_manager="attacker")
    try:
        await api.merge_patch(CLUSTER_VERSION, "version", patch)
    except NodeAgentError as exc:
        return exc.message
    finally:
        await api.close()
    return ""


def target(digest: str, **more: Any) -> dict[str, Any]:
    return {"spec": {"desiredUpdate": {"image": release_image(digest), **more}}}


async def refused(
    cluster: Cluster, patch: dict[str, Any], words: str, policy: str = POLICY
) -> None:
    before = cluster.cvo.get()
    message = await patched_by(cluster.node, patch)
    assert policy in message, message
    assert words in message.replace("\n", " "), message
    after = cluster.cvo.get()
    assert after["spec"] == before["spec"]
    assert after["metadata"].get("labels") == before["metadata"].get("labels")


async def test_a_node_may_not_force(cluster: Cluster) -> None:
    await refused(cluster, target(NEW, force=True), "may never set spec.desiredUpdate.force")


async def test_a_node_may_not_move_to_a_release_another_node_has_not_pinned(
    cluster: Cluster,
) -> None:
    await refused(cluster, target(HALF), "node edge-2 has not pinned that release", PINNED_POLICY)


async def test_a_node_may_not_name_a_release_by_tag_or_version(cluster: Cluster) -> None:
    by_tag = {"spec": {"desiredUpdate": {"image": "quay.io/openshift/release:4.17.0"}}}
    await refused(cluster, by_tag, "named by digest")
    by_version = {"spec": {"desiredUpdate": {"version": "4.17.0"}}}
    await refused(cluster, by_version, "named by digest")


@pytest.mark.parametrize(
    "patch",
    [
        {"spec": {"channel": "fast-4.17"}},
        {"spec": {"upstream": "https://attacker.example/graph"}},
        {"spec": {"overrides": [{"kind": "Deployment", "group": "apps", "name": "x",
                                 "namespace": "y", "unmanaged": True}]}},
        {"metadata": {"labels": {"owned-by": "node"}}},
        {"spec": {"channel": "fast-4.17", **target(NEW)["spec"]}},
    ],
)  # fmt: skip
async def test_a_node_may_change_nothing_but_the_desired_update(
    cluster: Cluster, patch: dict[str, Any]
) -> None:
    await refused(cluster, patch, "may change only spec.desiredUpdate")


async def test_a_node_may_not_delete_it_or_write_its_status(cluster: Cluster) -> None:
    deleted = cluster.kube.kubectl(
        "delete", "clusterversion", "version", "--wait=false", kubeconfig=cluster.node
    )
    assert deleted.returncode != 0
    status = cluster.kube.kubectl(
        "patch", "clusterversion", "version", "--subresource=status", "--type=merge",
        "-p", '{"status":{"desired":{"version":"9.9.9"}}}', kubeconfig=cluster.node,
    )  # fmt: skip
    assert status.returncode != 0 and "forbidden" in status.stderr.lower()
    assert cluster.cvo.get()["status"]["desired"]["version"] == "4.16.3"


async def test_the_good_change_passes_and_admins_are_not_judged(cluster: Cluster) -> None:
    assert await patched_by(cluster.node, target(NEW)) == ""
    assert cluster.cvo.get()["spec"]["desiredUpdate"]["image"] == release_image(NEW)
    admin = cluster.kube.admin_kubeconfig
    assert await patched_by(admin, {"spec": {"channel": "fast-4.17"}}) == ""
    assert await patched_by(admin, target(HALF, force=True)) == ""
    assert await patched_by(admin, target(NEW, force=None)) == ""


async def test_with_no_status_at_all_the_shape_rules_still_hold(cluster: Cluster) -> None:
    cluster.kube.kubectl_ok("delete", "nis", *NODES)
    try:

        async def admitted() -> bool | None:
            return await patched_by(cluster.node, target(HALF)) == "" or None

        await wait_for_async(admitted, timeout_s=10, what="no params: the pin rule allows")
        await refused(cluster, target(NEW, force=True), "may never set spec.desiredUpdate.force")
        await refused(cluster, {"spec": {"channel": "x"}}, "may change only spec.desiredUpdate")
    finally:
        publish(cluster.kube, "edge-1", [NEW, HALF])
        publish(cluster.kube, "edge-2", [NEW])

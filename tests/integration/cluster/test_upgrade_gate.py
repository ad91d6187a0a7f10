"""The upgrade gate (deploy/upgrade-gate.yaml) on the real kube-apiserver.

openshift/api's ClusterVersion CRD, the NodeImageStatus CRD of deploy/crds and the gate as
shipped. Two nodes publish their status; the tests move ``spec.desiredUpdate`` as an admin
(``oc adm upgrade --to-image`` writes the same field) and the status as the CVO stand-in:

* a target some node has not pinned is refused with a message naming that node, and the
  ClusterVersion stays as it was; a target every node pinned passes;
* clearing the target, a channel edit and ``force`` on the same target pass while a node has
  not pinned it; the CVO's status writes always pass;
* a target by tag or by version alone is refused (nothing to match a digest against);
* with no NodeImageStatus at all, every change passes (``parameterNotFoundAction: Allow``,
  decision 0065); the gate is in force again as soon as one node publishes.
About 6 s with the API server running.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.testenv.cvo import CvoStandIn, Target, install_crd, release_image
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import DEPLOY, install_deploy
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration

GATE = DEPLOY / "upgrade-gate.yaml"
OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
OTHER = "sha256:" + "d" * 64
NODES = ("edge-1", "edge-2")


def publish(kube: KubeCluster, node: str, releases: list[dict[str, Any]]) -> None:
    """The node's NodeImageStatus with ``status.releases`` (written as the admin)."""
    body = {
        "apiVersion": "nodeagent.io/v1alpha1",
        "kind": "NodeImageStatus",
        "metadata": {"name": node},
        "spec": {"nodeName": node},
    }
    kube.kubectl_ok("apply", "--server-side", "-f", "-", input=json.dumps(body))
    obj = json.loads(kube.kubectl_ok("get", "nis", node, "-o", "json"))
    obj["status"] = {"nodeName": node, "releases": releases}
    kube.kubectl_ok("replace", "--subresource=status", "-f", "-", input=json.dumps(obj))


def release(digest: str, version: str, *, pinned: bool) -> dict[str, Any]:
    return {"digest": digest, "version": version, "set": f"release-{version}", "pinned": pinned}


def set_target(
    kube: KubeCluster, image: str = "", version: str = "", force: bool = False
) -> subprocess.CompletedProcess[str]:
    update: dict[str, Any] = {"image": image} if image else {}
    if version:
        update["version"] = version
    if force:
        update["force"] = True
    patch = json.dumps({"spec": {"desiredUpdate": update}})
    return kube.kubectl("patch", "clusterversion", "version", "--type=merge", "-p", patch)


def settled(kube: KubeCluster, image: str, *, allowed: bool) -> subprocess.CompletedProcess[str]:
    """``set_target`` once the API server's copy of the params caught up with the last
    ``publish`` (its informer lags the write by milliseconds)."""
    results: list[subprocess.CompletedProcess[str]] = []

    def done() -> bool:
        results.append(set_target(kube, image))
        return (results[-1].returncode == 0) is allowed

    wait_for(done, timeout_s=10, what=f"the gate {'allows' if allowed else 'refuses'} {image}")
    return results[-1]


def desired_update(cvo: CvoStandIn) -> Any:
    return cvo.get()["spec"].get("desiredUpdate")


@pytest.fixture(scope="module")
def cvo(kube: KubeCluster) -> Iterator[CvoStandIn]:
    install_deploy(kube)
    install_crd(kube)
    # The session's API server is shared: a NodeImageStatus another module left behind is a
    # node of this cluster to the gate (every NodeImageStatus is a param), so start clean.
    kube.kubectl_ok("delete", "nis", "--all", "--wait")
    standin = CvoStandIn(kube)
    standin.install("4.16.3", release_image(OLD))
    for node in NODES:
        publish(kube, node, [release(OLD, "4.16.3", pinned=True)])
    kube.kubectl_ok("apply", "--server-side", "-f", str(GATE))

    def in_force() -> bool:
        probe = kube.kubectl(
            "patch", "clusterversion", "version", "--type=merge", "--dry-run=server",
            "-p", '{"spec":{"desiredUpdate":{"image":"quay.io/x/y:4.16.5"}}}',
        )  # fmt: skip
        return "nodeagent-upgrade-gate" in probe.stderr

    wait_for(in_force, timeout_s=30, what="the upgrade gate in force")
    yield standin
    kube.kubectl("delete", "--ignore-not-found", "-f", str(GATE))
    kube.kubectl("delete", "nis", "--all")
    kube.kubectl("delete", "clusterversion", "version", "--ignore-not-found")


@pytest.fixture
def fresh(cvo: CvoStandIn) -> CvoStandIn:
    """ClusterVersion at 4.16.3, no target; both nodes hold 4.16.5, only edge-1 pinned it."""
    cvo.install("4.16.3", release_image(OLD))
    publish(
        cvo.kube,
        "edge-1",
        [release(OLD, "4.16.3", pinned=True), release(NEW, "4.16.5", pinned=True)],
    )
    publish(
        cvo.kube,
        "edge-2",
        [release(OLD, "4.16.3", pinned=True), release(NEW, "4.16.5", pinned=False)],
    )
    return cvo


def test_a_target_one_node_has_not_pinned_is_refused_naming_it(fresh: CvoStandIn) -> None:
    refused = settled(fresh.kube, release_image(NEW), allowed=False)
    assert "node edge-2 has not pinned release " + NEW in refused.stderr
    assert "edge-1" not in refused.stderr
    assert desired_update(fresh) is None
    # the same release from another repository is the same target: refused too
    assert set_target(fresh.kube, release_image(NEW, "mirror.site.example/ocp/release")).returncode


def test_a_target_every_node_pinned_passes_and_the_cvo_moves(fresh: CvoStandIn) -> None:
    publish(fresh.kube, "edge-2", [release(NEW, "4.16.5", pinned=True)])
    settled(fresh.kube, release_image(NEW), allowed=True)
    assert fresh.reconcile("4.16.5") is not None  # the CVO's status write passes
    fresh.complete()
    assert fresh.get()["status"]["history"][0]["state"] == "Completed"


def test_clear_channel_and_force_on_the_same_target_pass(fresh: CvoStandIn) -> None:
    publish(fresh.kube, "edge-2", [release(NEW, "4.16.5", pinned=True)])
    settled(fresh.kube, release_image(NEW), allowed=True)
    publish(fresh.kube, "edge-2", [release(NEW, "4.16.5", pinned=False)])  # a node lost it

    channel = fresh.kube.kubectl(
        "patch",
        "clusterversion",
        "version",
        "--type=merge",
        "-p",
        '{"spec":{"channel":"eus-4.16"}}',
    )
    assert channel.returncode == 0, channel.stderr
    forced = set_target(fresh.kube, release_image(NEW), force=True)
    assert forced.returncode == 0, forced.stderr
    assert desired_update(fresh) == {"image": release_image(NEW), "force": True}
    cleared = fresh.kube.kubectl(
        "patch", "clusterversion", "version", "--type=json",
        "-p", '[{"op":"remove","path":"/spec/desiredUpdate"}]',
    )  # fmt: skip
    assert cleared.returncode == 0, cleared.stderr
    assert desired_update(fresh) is None
    # and from no target, the unpinned one is refused again
    assert "node edge-2" in settled(fresh.kube, release_image(NEW), allowed=False).stderr


def test_status_writes_are_never_judged(fresh: CvoStandIn) -> None:
    """The CVO (and anyone with the verb) writes clusterversions/status to any release."""
    written = fresh.begin(Target("4.16.9", release_image(OTHER)))
    assert written["status"]["desired"]["image"] == release_image(OTHER)
    status = fresh.get()["status"]
    status["desired"] = {"version": "4.16.10", "image": release_image(NEW)}
    fresh.write_status(status, kubeconfig=fresh.kube.admin_kubeconfig)


@pytest.mark.parametrize(
    ("image", "version"),
    [("quay.io/openshift-release-dev/ocp-release:4.16.5-x86_64", ""), ("", "4.16.5")],
    ids=["by-tag", "by-version"],
)
def test_a_target_not_by_digest_is_refused(fresh: CvoStandIn, image: str, version: str) -> None:
    publish(fresh.kube, "edge-2", [release(NEW, "4.16.5", pinned=True)])
    settled(fresh.kube, release_image(NEW), allowed=True)  # the params caught up
    fresh.kube.kubectl_ok(
        "patch", "clusterversion", "version", "--type=json",
        "-p", '[{"op":"remove","path":"/spec/desiredUpdate"}]',
    )  # fmt: skip
    refused = set_target(fresh.kube, image, version)
    assert refused.returncode != 0
    assert "names no release image by digest" in refused.stderr


def test_no_node_status_at_all_lets_every_change_pass(fresh: CvoStandIn) -> None:
    kube = fresh.kube
    kube.kubectl_ok("delete", "nis", "--all", "--wait")

    def passes() -> bool:
        return set_target(kube, release_image(OTHER)).returncode == 0

    wait_for(passes, timeout_s=30, what="the gate without params lets a target pass")
    assert desired_update(fresh) == {"image": release_image(OTHER)}
    publish(kube, "edge-1", [release(NEW, "4.16.5", pinned=True)])

    # edge-1 pinned NEW: allowed; OTHER it has not: refused, naming edge-1
    unpinned = release_image("sha256:" + "e" * 64)
    wait_for(
        lambda: "node edge-1 has not pinned" in set_target(kube, unpinned).stderr,
        timeout_s=30,
        what="the gate in force again once a node publishes",
    )
    settled(kube, release_image(NEW), allowed=True)

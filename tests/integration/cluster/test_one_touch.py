"""The one-touch upgrade on the real kube-apiserver, with the CVO stand-in and a real store.

Two nodes (touch-1 and touch-2: their own identities, deploy/rbac.yaml and the opt-ins
upgrade-start.yaml and release-signatures.yaml applied) each run
``cluster.starting.UpgradeStarter`` over a store that holds the signed 4.17.0 release bundle.
While touch-2's NodeImageStatus does not list the release pinned, nothing starts; once it
does, exactly one agent (the first node by name whose kubelet Lease is fresh: touch-2, since
touch-1's is stale) applies the release's signature ConfigMap and sets ClusterVersion's
``desiredUpdate`` to the release image by digest, so the CVO stand-in begins the update, and
no second start follows; an Event UpgradeStarted on touch-2's Node says who and why.
About 5 s with the API server running.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.bundles.release import ConfigMaps, StoredSignatures
from nodeagent.adapters.kube import KubeApi
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.adapters.store.releases import StoredReleases
from nodeagent.bundles.handover import set_file_name
from nodeagent.bundles.release_signatures import SignaturePublisher
from nodeagent.cluster.objects import FIELD_MANAGER
from nodeagent.cluster.starting import UpgradeStarter
from nodeagent.cluster.tasks import Connection
from nodeagent.status import Condition
from tests.testenv.cvo import CvoStandIn, install_crd, release_image
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import DEPLOY, install_deploy
from tests.testenv.signed_bundles import Keys, image, signed_bundle, with_release
from tests.testenv.waiting import wait_for_async

pytestmark = pytest.mark.integration

NODES = ("touch-1", "touch-2")
OLD = "sha256:" + "a" * 64
VERSION = "4.17.0"


def publish(kube: KubeCluster, node: str, digest: str, *, pinned: bool) -> None:
    body = {
        "apiVersion": "nodeagent.io/v1alpha1",
        "kind": "NodeImageStatus",
        "metadata": {"name": node},
        "spec": {"nodeName": node},
    }
    kube.kubectl_ok("apply", "--server-side", "-f", "-", input=json.dumps(body))
    obj = json.loads(kube.kubectl_ok("get", "nis", node, "-o", "json"))
    entry = {"digest": digest, "version": VERSION, "set": "release-4.17.0", "pinned": pinned}
    obj["status"] = {"nodeName": node, "releases": [entry]}
    kube.kubectl_ok("replace", "--subresource=status", "-f", "-", input=json.dumps(obj))


def node_lease(kube: KubeCluster, node: str, *, renewed: dt.datetime) -> None:
    """The node's Lease in kube-node-lease as its kubelet renews it (40 s, the default)."""
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": 40,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    kube.kubectl("create", "namespace", "kube-node-lease")
    kube.kubectl_ok(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(body)
    )


def cluster_at_4_16_3(kube: KubeCluster, digest: str) -> tuple[CvoStandIn, list[str]]:
    """The cluster at 4.16.3 with both opt-ins, touch-1's kubelet Lease stale and touch-2's
    fresh, touch-1 (and any Node another module left) pinned, touch-2 not yet; the other
    Nodes' names."""
    install_deploy(kube)
    install_crd(kube)
    # a NodeImageStatus another module left (without its Node) is a param of the admission
    # policy all the same: start from none
    kube.kubectl_ok("delete", "nis", "--all", "--wait")
    kube.kubectl("create", "namespace", "openshift-config-managed")  # another module may have
    for opt_in in ("release-signatures.yaml", "upgrade-start.yaml"):
        kube.kubectl_ok("apply", "--server-side", "-f", str(DEPLOY / "opt-in" / opt_in))
    cvo = CvoStandIn(kube)
    cvo.install("4.16.3", release_image(OLD))
    for node in NODES:
        kube.create_node(node)
    node_lease(kube, "touch-1", renewed=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5))
    node_lease(kube, "touch-2", renewed=dt.datetime.now(dt.UTC))
    # Nodes other modules of the session left: every Node is in scope, so they pin it too.
    listed = json.loads(kube.kubectl_ok("get", "nodes", "-o", "json"))["items"]
    others = [n["metadata"]["name"] for n in listed if n["metadata"]["name"] not in NODES]
    for other in others:
        publish(kube, other, digest, pinned=True)
    publish(kube, "touch-1", digest, pinned=True)
    publish(kube, "touch-2", digest, pinned=False)
    return cvo, others


def check_started_event(kube: KubeCluster, node: str) -> None:
    """One Event UpgradeStarted, on ``node``'s Node, saying who and why."""
    events = json.loads(kube.kubectl_ok("get", "events", "-n", "default", "-o", "json"))["items"]
    found = [e for e in events if e.get("reason") == "UpgradeStarted"]
    assert len(found) == 1 and found[0]["involvedObject"]["name"] == node, found
    assert "every node (" in found[0]["message"] and "4.17.0" in found[0]["message"]


def stored_release(work: Path) -> tuple[Path, Path, str, str]:
    """A node store holding the signed 4.17.0 release bundle and its set file."""
    keys = Keys.make(work / "keys")
    built = [image("ocp/release-417", [(4096, 4170)], work / "cache")]
    signed = signed_bundle(
        work / "bundle", keys, built, bundle_id="release-4.17.0", set_name="release-4.17.0"
    )
    signed = with_release(signed, keys, [b"a signature of 4.17.0"], version=VERSION)
    store, specs = work / "store", work / "specs"
    copy_bundle(store, signed.root, signed.manifest, keys.trusted_dir)
    own = store / "bundles" / "release-4.17.0" / "release-signatures"
    if not own.exists():
        shutil.copytree(signed.root / "release-signatures", own)
    specs.mkdir()
    (specs / set_file_name("release-4.17.0", "release-4.17.0")).write_text("set\n")
    release = signed.manifest.release
    assert release is not None
    return store, keys.trusted_dir, release.image.digest, str(release.image)


@pytest.mark.timeout(120)
async def test_one_agent_starts_the_upgrade_once_every_node_pinned_the_release(
    kube: KubeCluster, tmp_path: Path
) -> None:
    store, trusted, digest, image_ref = stored_release(tmp_path)
    cvo, others = cluster_at_4_16_3(kube, digest)

    apis, starters = [], []
    said: dict[str, list[Condition]] = {node: [] for node in NODES}
    for node in NODES:
        api = KubeApi(kube.kubeconfig_for_node(node), timeout_s=10, field_manager=FIELD_MANAGER)
        publisher = SignaturePublisher(StoredSignatures(store, trusted), ConfigMaps(api))
        starter = UpgradeStarter(
            api,
            Connection(api.server),
            StoredReleases(store, [tmp_path / "specs"]),
            node=node,
            publish_signatures=publisher.publish,
            recheck_s=0.3,
        )
        starter.on_said = said[node].append  # what the node's status says (Reporter)
        apis.append(api)
        starters.append(starter)
    tasks = [asyncio.create_task(s.run()) for s in starters]
    try:

        async def all_said(reason: str) -> bool | None:
            return all(s.said is not None and s.said[0] == reason for s in starters) or None

        await wait_for_async(lambda: all_said("SiteNotReady"), timeout_s=30, what="not ready")
        assert "'touch-2' (not pinned yet)" in (starters[0].said or ("", ""))[1]
        assert "desiredUpdate" not in cvo.get()["spec"]
        # What each node says once it pinned the release (decision 0073): read from the real
        # NodeImageStatuses under the node's own identity; touch-2 counts itself ready.
        total = len(NODES) + len(others)
        seen = [s.readiness(digest) for s in starters]
        assert [(r.ready, r.nodes) if r else None for r in seen] == [
            (total - 1, total),
            (total, total),
        ]

        publish(kube, "touch-2", digest, pinned=True)

        async def started() -> dict[str, Any] | None:
            update = cvo.get()["spec"].get("desiredUpdate")
            return update if update else None

        update = await wait_for_async(started, timeout_s=30, what="the upgrade started")
        assert update == {"image": image_ref, "version": VERSION}, others
        assert image_ref.endswith("@" + digest)
        assert cvo.reconcile() is not None  # the CVO begins the update
        await wait_for_async(lambda: all_said("UpgradeInProgress"), timeout_s=30, what="running")
        assert sum(len(s.started) for s in starters) == 1

        # touch-1's Lease is stale (its kubelet stopped renewing): touch-2 was elected.
        assert [s.node for s in starters if s.started] == ["touch-2"]
        check_started_event(kube, "touch-2")
        # the status says who started it and why, and why the other node did not
        started_said = [c for c in said["touch-2"] if c.is_true]
        assert [(c.type, c.reason) for c in started_said] == [("UpgradeStart", "UpgradeStarted")]
        assert "touch-2 set ClusterVersion's desiredUpdate to release" in started_said[0].message
        assert "has pinned release '4.17.0'" in started_said[0].message  # every node, others too
        assert not any(c.is_true for c in said["touch-1"])
        assert said["touch-1"][0].reason == "SiteNotReady"
        name = digest.replace(":", "-")
        args = ("get", "configmap", "-n", "openshift-config-managed", name, "-o", "json")
        config_map = json.loads(kube.kubectl_ok(*args))
        assert config_map["binaryData"]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for api in apis:
            await api.close()
        kube.kubectl("delete", "nis", *NODES, *others, "--ignore-not-found")
        kube.kubectl("delete", "node", *NODES, "--ignore-not-found")
        kube.kubectl("delete", "clusterversion", "version", "--ignore-not-found")
        for opt_in in ("upgrade-start.yaml", "release-signatures.yaml"):
            kube.kubectl("delete", "--wait=false", "-f", str(DEPLOY / "opt-in" / opt_in))

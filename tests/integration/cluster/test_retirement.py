"""Release retirement on the real kube-apiserver, with the CVO stand-in and a real store.

Three signed release bundles (4.16.1, 4.16.2, 4.17.0) are copied into a node store and their
sets placed in a spec directory, as an import leaves them. ``cluster.retiring`` reads the
ClusterVersion (openshift/api's CRD, moved by tests/testenv/cvo.py) and the
MachineConfigPools with the node's own identity and deploy/rbac.yaml, and the store through
``adapters.store.releases``. Proves: nothing is retired while the upgrade is Partial, while a
pool is still rolling out or paused, or while ClusterVersion reads wrong; once the upgrade to
4.17.0 completed everywhere, 4.16.1 alone is unpinned (current 4.17.0 and previous 4.16.2
stay), its blobs go at the store's next collection after the grace period, and its signed
manifest and signature stay, so its anti-rollback mark is still derived.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.adapters.kube import KubeApi
from nodeagent.adapters.store import keeper
from nodeagent.adapters.store.accepted import accepted_stamps
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.adapters.store.releases import StoredReleases
from nodeagent.bundles.handover import set_file_name
from nodeagent.cluster import kinds
from nodeagent.cluster.objects import FIELD_MANAGER
from nodeagent.cluster.retirement import Plan
from nodeagent.cluster.retiring import ReleaseRetirer
from nodeagent.cluster.tasks import Connection
from nodeagent.store.keeping import KeepRules
from nodeagent.store.layout import MANIFEST_NAME, SIGNATURE_NAME, bundle_dir
from tests.testenv.cvo import CvoStandIn, Target, install_crd, release_image
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import apply, install_deploy, install_mco, pool
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle, with_release
from tests.testenv.waiting import wait_for_async

pytestmark = pytest.mark.integration

VERSIONS = ("4.16.1", "4.16.2", "4.17.0")
NODE = "retire-node"


@dataclass(frozen=True)
class Site:
    store: Path
    specs: Path
    bundles: dict[str, Signed]
    trusted: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    work = tmp_path_factory.mktemp("retire")
    keys = Keys.make(work / "keys")
    store, specs = work / "store", work / "specs"
    specs.mkdir()
    bundles = {}
    for n, version in enumerate(VERSIONS):
        built = [image(f"ocp/release-{n}", [(4096, 900 + n)], work / "cache")]
        built.append(image(f"ocp/payload-{n}", [(8192, 950 + n), (2048, 999)], work / "cache"))
        bundle_id = f"release-{version}"
        signed = signed_bundle(
            work / bundle_id, keys, built, bundle_id=bundle_id, set_name=bundle_id, sequence=n + 1
        )
        signed = with_release(signed, keys, [b"signature of " + version.encode()], version=version)
        copy_bundle(store, signed.root, signed.manifest, keys.trusted_dir)
        (specs / set_file_name(bundle_id, bundle_id)).write_text("set file\n")
        bundles[version] = signed
    return Site(store, specs, bundles, keys.trusted_dir)


@pytest.fixture(scope="module")
def cvo(kube: KubeCluster) -> Iterator[CvoStandIn]:
    install_deploy(kube)
    install_mco(kube)
    install_crd(kube)
    kube.create_node(NODE)
    yield CvoStandIn(kube)
    kube.kubectl("delete", "clusterversion", "version", "--ignore-not-found")
    kube.kubectl("delete", "machineconfigpools", "--all", "--ignore-not-found")
    kube.kubectl("delete", "node", NODE, "--ignore-not-found")


def digest_of(site: Site, version: str) -> str:
    release = site.bundles[version].manifest.release
    assert release is not None
    return release.image.digest


def set_pool(
    kube: KubeCluster, name: str, *, updated: int = 2, paused: bool = False, updating: bool = False
) -> None:
    body = pool(name, {f"node-role.kubernetes.io/{name}": ""}, [])
    body["spec"]["paused"] = paused
    apply(kube, body)
    status = {
        "status": {
            "machineCount": 2,
            "updatedMachineCount": updated,
            "conditions": [
                {"type": "Updated", "status": "False" if updating else "True"},
                {"type": "Updating", "status": "True" if updating else "False"},
            ],
        }
    }
    kube.kubectl_ok(
        "patch", "machineconfigpool", name, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip


def upgrade(kube: KubeCluster, cvo: CvoStandIn, site: Site, version: str) -> None:
    patch = {"spec": {"desiredUpdate": {"image": release_image(digest_of(site, version))}}}
    kube.kubectl_ok("patch", "clusterversion", "version", "--type=merge", "-p", json.dumps(patch))
    cvo.begin(Target(version, release_image(digest_of(site, version))))


def pinned(site: Site) -> set[str]:
    return {
        v for v in VERSIONS if (site.specs / set_file_name(f"release-{v}", f"release-{v}")).exists()
    }


@pytest.mark.timeout(120)
async def test_old_releases_retire_only_once_the_upgrade_finished_everywhere(
    kube: KubeCluster, cvo: CvoStandIn, site: Site
) -> None:
    cvo.install("4.16.1", release_image(digest_of(site, "4.16.1")))
    for name in ("master", "worker"):
        set_pool(kube, name)
    plans: list[Plan] = []
    api = KubeApi(kube.kubeconfig_for_node(NODE), timeout_s=10, field_manager=FIELD_MANAGER)
    retirer = ReleaseRetirer(
        api,
        Connection(api.server),
        StoredReleases(site.store, [site.specs]),
        keep_releases=2,
        recheck_s=0.2,
        on_plan=plans.append,
    )

    async def follow_pools() -> None:
        async for snapshot in api.informer(kinds.MACHINE_CONFIG_POOL):
            retirer.set_pools(snapshot)

    async def plan_says(reason: str, text: str = "") -> Plan | None:
        last = plans[-1] if plans else None
        return last if last and last.reason == reason and text in last.message else None

    tasks = [asyncio.create_task(retirer.run()), asyncio.create_task(follow_pools())]
    try:
        await wait_for_async(lambda: plan_says("NothingToRetire"), timeout_s=20, what="judged")
        assert pinned(site) == set(VERSIONS)

        # 4.16.2: Partial, then Completed with the worker pool still rolling out, then paused.
        upgrade(kube, cvo, site, "4.16.2")
        await wait_for_async(lambda: plan_says("UpgradeNotCompleted"), timeout_s=20, what="partial")
        set_pool(kube, "worker", updated=1, updating=True)
        cvo.complete()
        await wait_for_async(lambda: plan_says("PoolNotUpdated"), timeout_s=20, what="rolling")
        set_pool(kube, "worker", paused=True)
        await wait_for_async(lambda: plan_says("PoolPaused"), timeout_s=20, what="paused")
        set_pool(kube, "worker")
        await wait_for_async(lambda: plan_says("NothingToRetire"), timeout_s=20, what="4.16.2")
        assert pinned(site) == set(VERSIONS), "current 4.16.2, previous 4.16.1, newer 4.17.0"

        # 4.17.0: nothing before Completed; then 4.16.1 alone goes.
        upgrade(kube, cvo, site, "4.17.0")
        await wait_for_async(lambda: plan_says("UpgradeNotCompleted"), timeout_s=20, what="partial")
        assert pinned(site) == set(VERSIONS)
        cvo.complete()
        await wait_for_async(lambda: plan_says("NothingToRetire"), timeout_s=20, what="retired")
        assert any(p.reason == "ReleasesRetired" and "'4.16.1'" in p.message for p in plans)
        assert pinned(site) == {"4.16.2", "4.17.0"}

        # A ClusterVersion that reads wrong retires nothing and says why.
        status = cvo.get()["status"]
        status["history"][0]["version"] = "4.17"
        cvo.write_status(status)
        await wait_for_async(
            lambda: plan_says("ReleaseVersionInvalid"), timeout_s=20, what="odd version"
        )
        assert pinned(site) == {"4.16.2", "4.17.0"}
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await api.close()
    check_store_collects_only_the_retired_blobs(site)


def check_store_collects_only_the_retired_blobs(site: Site) -> None:
    """The retired bundle's own blobs go after the grace period; shared ones and its signed
    manifest stay, and its anti-rollback stamp is still derived."""
    old = site.bundles["4.16.1"].manifest
    own = set(old.blobs) - {d for v in ("4.16.2", "4.17.0") for d in site.bundles[v].manifest.blobs}
    pinned_sets = [f"release-{v}" for v in pinned(site)]
    rules = KeepRules(gc_grace_s=600, keep_newest_per_channel=True)
    later = time.time() + 3600  # past the "copied within the grace period" rule
    keeper.collect(site.store, pinned_sets, rules, now_s=later)
    assert all((site.store / "blobs" / "sha256" / d.removeprefix("sha256:")).exists() for d in own)
    keeper.collect(site.store, pinned_sets, rules, now_s=later + 601)
    assert own and not any(
        (site.store / "blobs" / "sha256" / d.removeprefix("sha256:")).exists() for d in own
    )
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        assert (site.store / bundle_dir("release-4.16.1") / name).is_file()
    assert "release-4.16.1" in {s.bundle_id for s in accepted_stamps(site.store, site.trusted)}

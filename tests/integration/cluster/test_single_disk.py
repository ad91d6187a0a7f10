"""Single node, one disk: three successive release bundles on a store that fits two.

The node store lives on a tmpfs this test mounts, sized for two releases (each a 3 MiB layer
of its own) plus the store's small files and a 1 MiB reserve. The cluster (the real
kube-apiserver, the CVO stand-in, two MachineConfigPools) upgrades 4.16.1 → 4.16.2, completed
and rolled out in between; the retirer judges after each step. Proves: release 4.16.1 stays
pinned as the previous release (``keep_releases = 2``), so the space it holds is never
counted as free; the copy of the third release (4.16.3) is refused before its first byte
with ``InsufficientDiskSpace`` and the figures; the filesystem never goes below the reserve.
The store-level half of issue 26's item 6; test_single_disk_crio.py plays the whole node
(CRI-O's storage on the same filesystem, a real daemon). Needs root (mount). About 4 s with
the API server running.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.kube import KubeApi
from nodeagent.adapters.store.copier import StoreLimits, copy_bundle
from nodeagent.adapters.store.releases import StoredReleases
from nodeagent.bundles.handover import set_file_name
from nodeagent.cluster import kinds
from nodeagent.cluster.objects import FIELD_MANAGER
from nodeagent.cluster.retiring import ReleaseRetirer
from nodeagent.cluster.tasks import Connection
from nodeagent.errors import InsufficientDiskSpace
from tests.testenv.cvo import CvoStandIn, Target, install_crd, release_image
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import apply, install_deploy, install_mco, pool
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle, with_release

pytestmark = [
    pytest.mark.integration,
    pytest.mark.needs("root"),  # mount(2) of a tmpfs
]

MIB = 1 << 20
RESERVE = MIB
VERSIONS = ("4.16.1", "4.16.2", "4.16.3")
NODE = "single-node"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 8 MiB: two releases of 3 MiB and a bit, not three."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mountpoint)], check=True
    )
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=False)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def release_bundles(work: Path) -> tuple[Keys, dict[str, Signed]]:
    keys = Keys.make(work / "keys")
    bundles = {}
    for n, version in enumerate(VERSIONS):
        built = [image(f"ocp/single-{n}", [(3 * MIB, 3100 + n)], work / "cache")]
        bundle_id = f"release-{version}"
        signed = signed_bundle(
            work / bundle_id, keys, built, bundle_id=bundle_id, set_name=bundle_id, sequence=n + 1
        )
        bundles[version] = with_release(signed, keys, [b"sig " + version.encode()], version=version)
    return keys, bundles


def updated_pools(kube: KubeCluster) -> None:
    for name in ("master", "worker"):
        apply(kube, pool(name, {f"node-role.kubernetes.io/{name}": ""}, []))
        status = {
            "status": {
                "machineCount": 1,
                "updatedMachineCount": 1,
                "conditions": [
                    {"type": "Updated", "status": "True"},
                    {"type": "Updating", "status": "False"},
                ],
            }
        }
        kube.kubectl_ok(
            "patch", "machineconfigpool", name, "--subresource=status", "--type=merge",
            "-p", json.dumps(status),
        )  # fmt: skip


@pytest.mark.timeout(120)
async def test_three_releases_on_a_disk_for_two_the_third_is_refused_before_a_byte(
    kube: KubeCluster, disk: Path, tmp_path: Path
) -> None:
    keys, bundles = release_bundles(tmp_path / "work")
    store, specs = disk / "store", tmp_path / "specs"
    specs.mkdir()
    install_deploy(kube)
    install_mco(kube)
    install_crd(kube)
    kube.create_node(NODE)
    cvo = CvoStandIn(kube)
    digest = {v: b.manifest.release.image.digest for v, b in bundles.items() if b.manifest.release}
    cvo.install("4.16.1", release_image(digest["4.16.1"]))
    updated_pools(kube)
    limits = StoreLimits(reserve_bytes=RESERVE)
    api = KubeApi(kube.kubeconfig_for_node(NODE), timeout_s=10, field_manager=FIELD_MANAGER)
    retirer = ReleaseRetirer(
        api, Connection(api.server), StoredReleases(store, [specs]), keep_releases=2
    )

    async def judge() -> str:
        retirer.set_cluster_version(cvo.get())
        pools = {p["metadata"]["name"]: p for p in (await api.list(kinds.MACHINE_CONFIG_POOL))[0]}
        retirer.set_pools(pools)
        return (await retirer.judge()).reason

    def import_release(version: str) -> None:
        signed = bundles[version]
        copy_bundle(store, signed.root, signed.manifest, keys.trusted_dir, limits=limits)
        (specs / set_file_name(f"release-{version}", f"release-{version}")).write_text("set\n")
        assert free_bytes(disk) >= RESERVE

    try:
        import_release("4.16.1")
        import_release("4.16.2")
        assert await judge() == "NothingToRetire"

        patch = {"spec": {"desiredUpdate": {"image": release_image(digest["4.16.2"])}}}
        kube.kubectl_ok(
            "patch", "clusterversion", "version", "--type=merge", "-p", json.dumps(patch)
        )
        cvo.begin(Target("4.16.2", release_image(digest["4.16.2"])))
        assert await judge() == "UpgradeNotCompleted"
        cvo.complete()
        assert await judge() == "NothingToRetire"  # 4.16.1 is the previous release: kept
        assert {p.name for p in specs.iterdir()} == {
            set_file_name(f"release-{v}", f"release-{v}") for v in ("4.16.1", "4.16.2")
        }

        before = free_bytes(disk)
        with pytest.raises(InsufficientDiskSpace) as refused:
            import_release("4.16.3")
        # "bundle release-4.16.3 into the image store not enough disk space: needs 3 MiB,
        # 1.9 MiB available on the image filesystem, 1 MiB must stay free; free at least ..."
        assert "into the image store not enough disk space: needs 3 MiB" in refused.value.message
        assert free_bytes(disk) >= before - 64 * 1024  # nothing of the third was written
        assert free_bytes(disk) >= RESERVE
        assert not (store / "bundles" / "release-4.16.3" / "record.json").exists()
        # What the importer adds to such a refusal (ImporterPorts.space_note):
        note = retirer.space_note()
        assert "'4.16.2' (current), '4.16.1' (previous)" in note or (
            "'4.16.1' (previous), '4.16.2' (current)" in note
        ), note
    finally:
        await api.close()
        kube.kubectl("delete", "clusterversion", "version", "--ignore-not-found")
        kube.kubectl("delete", "machineconfigpools", "--all", "--ignore-not-found")
        kube.kubectl("delete", "node", NODE, "--ignore-not-found")

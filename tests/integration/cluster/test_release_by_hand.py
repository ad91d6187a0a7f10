"""``bundle remove`` and ``unpin`` of a release bundle follow retirement's rules, judged on the
real kube-apiserver with the CVO stand-in (decision 0072).

The node's store holds three signed release bundles (4.16.1, 4.16.2, 4.17.0), none of
their sets pinned. The commands read ClusterVersion and the MachineConfigPools with the
node's own identity (deploy/rbac.yaml). Proves: the current release is never removed
(``ReleaseInUse``, 65), an older one is; during an upgrade the release it moves to is not
(``ReleaseInUse``); with a pool paused or outside cluster mode nothing is judged safe
(``ReleaseStateUnknown``, 75); ``unpin`` of the current release's set is refused before its
file is touched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.bundles.handover import set_file_name
from nodeagent.cli.main import main
from tests.integration.cluster.test_retirement import set_pool
from tests.testenv.agent import pinned_image_set_yaml
from tests.testenv.cvo import CvoStandIn, Target, install_crd, release_image
from tests.testenv.kube import KubeCluster
from tests.testenv.kubeobjects import install_deploy, install_mco
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle, with_release

pytestmark = pytest.mark.integration

VERSIONS = ("4.16.1", "4.16.2", "4.17.0")
NODE = "by-hand-node"


@pytest.fixture
def cvo(kube: KubeCluster) -> Iterator[CvoStandIn]:
    install_deploy(kube)
    install_mco(kube)
    install_crd(kube)
    kube.create_node(NODE)
    yield CvoStandIn(kube)
    kube.kubectl("delete", "clusterversion", "version", "--ignore-not-found")
    kube.kubectl("delete", "machineconfigpools", "--all", "--ignore-not-found")
    kube.kubectl("delete", "node", NODE, "--ignore-not-found")
    structlog.reset_defaults()


def node_root(work: Path, kubeconfig: Path | None) -> tuple[Path, dict[str, Signed]]:
    """A root with the store holding the three releases (as imported, then unpinned)."""
    keys = Keys.make(work / "keys")
    store = work / "root/var/lib/nodeagent/store"
    bundles = {}
    for n, version in enumerate(VERSIONS):
        built = [image(f"ocp/hand-{n}", [(4096, 1900 + n)], work / "cache")]
        bundle_id = f"release-{version}"
        signed = signed_bundle(
            work / bundle_id, keys, built, bundle_id=bundle_id, set_name=bundle_id, sequence=n + 1
        )
        signed = with_release(signed, keys, [b"signature of " + version.encode()], version=version)
        copy_bundle(store, signed.root, signed.manifest, keys.trusted_dir)
        bundles[version] = signed
    config = work / "root/etc/nodeagent/config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    cluster = f'[cluster]\nenabled = true\nkubeconfig = "{kubeconfig}"\n' if kubeconfig else ""
    config.write_text(
        f'[state]\ndir = "{work}/root/var/lib/nodeagent"\nrun_dir = "{work}/root/run/nodeagent"\n'
        f'[specs]\ndirs = ["{work}/root/etc/nodeagent/pinnedimagesets.d"]\n' + cluster
    )
    (work / "root/etc/nodeagent/pinnedimagesets.d").mkdir(parents=True, exist_ok=True)
    return work / "root", bundles


def digest_of(bundles: dict[str, Signed], version: str) -> str:
    release = bundles[version].manifest.release
    assert release is not None
    return release.image.digest


async def cli(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(
        main, [*argv, "--config", str(root / "etc/nodeagent/config.toml")]
    )
    errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: ")]
    return code, errors[0] if errors else ""


@pytest.mark.timeout(120)
async def test_release_bundles_go_by_hand_only_where_retirement_would_allow(
    kube: KubeCluster, cvo: CvoStandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, bundles = node_root(tmp_path, kube.kubeconfig_for_node(NODE))
    cvo.install("4.16.2", release_image(digest_of(bundles, "4.16.2")))
    for name in ("master", "worker"):
        set_pool(kube, name)

    code, line = await cli(capsys, root, "bundle", "remove", "release-4.16.2")
    assert code == 65 and line.startswith("error: ReleaseInUse: release '4.16.2'"), line
    specs = root / "etc/nodeagent/pinnedimagesets.d"
    set_file = specs / set_file_name("release-4.16.2", "release-4.16.2")
    ref = str(bundles["4.16.2"].manifest.images[0].ref)
    set_file.write_text(pinned_image_set_yaml("release-4.16.2", [ref]))
    code, line = await cli(capsys, root, "unpin", "release-4.16.2")
    assert code == 65 and line.startswith("error: ReleaseInUse: "), line
    assert set_file.is_file()  # refused before the file was touched
    code, line = await cli(capsys, root, "bundle", "remove", "release-4.16.1")
    assert (code, line) == (0, "")

    # An upgrade to 4.17.0 under way: the release it moves to stays.
    target = release_image(digest_of(bundles, "4.17.0"))
    cvo.begin(Target("4.17.0", target))
    code, line = await cli(capsys, root, "bundle", "remove", "release-4.17.0")
    assert code == 65 and line.startswith("error: ReleaseInUse: "), line
    assert "not Completed" in line
    cvo.complete()
    set_pool(kube, "worker", paused=True)
    set_file.unlink()
    code, line = await cli(capsys, root, "bundle", "remove", "release-4.16.2")
    assert code == 75 and line.startswith("error: ReleaseStateUnknown: "), line
    assert "paused" in line


async def test_outside_cluster_mode_a_release_is_never_judged_safe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _bundles = node_root(tmp_path, None)
    code, line = await cli(capsys, root, "bundle", "remove", "release-4.16.1")
    assert code == 75 and "not in cluster mode" in line, line
    code, line = await cli(capsys, root, "bundle", "remove", "not-a-release")
    assert code == 66 and line.startswith("error: BundleNotStored: "), line

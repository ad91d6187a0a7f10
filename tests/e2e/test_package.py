"""The package's life on a booted node: upgrade restarts the service and keeps configuration
and state; erase stops it and leaves nothing in CRI-O's configuration that could dangle.

A node of its own (the erase is final), with Debian's ``rpm`` inside, so the scriptlets run
against the node's real systemd, as ``dnf``/``rpm-ostree`` would run them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.conftest import Pushed
from tests.e2e.conftest import FLAVOUR, MODULES_DIR, MODULES_PACKAGE, booted_node, build_rpms
from tests.testenv.agent import set_state
from tests.testenv.node import DB_PATH, Node
from tests.testenv.registry import Registry
from tests.testenv.waiting import wait_for_async

SET = "e2e-package"
LINK = "etc/crio/crio.conf.d/99-nodeagent-pinned-images.conf"
TARGET = "/run/crio/crio.conf.d/99-nodeagent-pinned-images.conf"
CONFIG = "etc/nodeagent/config.toml"
LOCAL_CHANGE = 'level = "info"  # set on this node'


@pytest.fixture(scope="module")
def upgrade_rpms(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The same nodeagent and nodeagent-cli, one release later (0.1.0-1.e2e2 sorts after
    0.1.0-1)."""
    flavour = ("--without-bundled-deps",) if FLAVOUR == "distribution" else ()
    built = build_rpms(
        tmp_path_factory.mktemp("upgrade"),
        *("--nocheck", "--component-only", "--dist", ".e2e2", *flavour),
    )
    assert sorted(p.name for p in built) == [
        "nodeagent-0.1.0-1.e2e2.noarch.rpm",
        "nodeagent-cli-0.1.0-1.e2e2.noarch.rpm",
    ]
    return built


@pytest.fixture(scope="module")
def package_node(
    tmp_path_factory: pytest.TempPathFactory,
    rpms: list[Path],
    registry: Registry,
    pushed: Pushed,
) -> Iterator[Node]:
    with booted_node(tmp_path_factory.mktemp("package-node"), rpms, registry) as node:
        node.write_set(SET, [pushed.ref(pushed.base_a)])
        node.wait_status(lambda s: set_state(s, SET) == "Pinned", what=f"{SET} pinned")
        yield node


def rpm(node: Node, *args: str) -> str:
    return node.container.run("rpm", f"--dbpath={DB_PATH}", *args).stdout


async def pinned(node: Node, ref: str) -> bool | None:
    async with CriClient(node.cri_endpoint) as cri:
        image = await cri.image_status(ref)
    return None if image is None else image.is_pinned


async def test_upgrade_restarts_the_service_and_keeps_config_and_state(
    package_node: Node, upgrade_rpms: list[Path], pushed: Pushed
) -> None:
    node = package_node
    config = node.root / CONFIG
    config.write_text(config.read_text().replace('# level = "info"', LOCAL_CHANGE))
    before = node.show("nodeagent.service", "InvocationID")["InvocationID"]
    for upgrade_rpm in upgrade_rpms:
        shutil.copy2(upgrade_rpm, node.root / "var/tmp" / upgrade_rpm.name)

    rpm(node, "-U", "--nodeps", *(f"/var/tmp/{p.name}" for p in upgrade_rpms))

    assert rpm(node, "-q", "nodeagent").strip() == "nodeagent-0.1.0-1.e2e2.noarch"
    assert rpm(node, "-q", "nodeagent-cli").strip() == "nodeagent-cli-0.1.0-1.e2e2.noarch"
    node.wait_active("nodeagent.service")
    after = node.show("nodeagent.service", "InvocationID", "NRestarts")
    assert after["InvocationID"] != before, "the upgrade did not restart the service"
    assert LOCAL_CHANGE in config.read_text()  # %config(noreplace)
    assert (node.root / "var/lib/nodeagent/ledger.json").exists()
    node.wait_event("sync_finished")
    assert await pinned(node, pushed.ref(pushed.base_a)) is True
    # enabled, as the preset left it (not asked to be active: the session's node, in the
    # same network namespace, may hold 127.0.0.1:22626 already)
    assert node.show("nodeagent-mirror.socket", "UnitFileState")["UnitFileState"] == "enabled"


def test_cluster_mode_is_installed_whole(package_node: Node) -> None:
    """Its client comes from the bundled wheels and the per-cluster manifests are shipped."""
    node = package_node
    code = (
        "import sys; sys.path[:0] = ['/usr/lib/nodeagent/site-packages', "
        "'/usr/lib/nodeagent/vendor']; "
        "import nodeagent.adapters.kube, lightkube; print(lightkube.__file__)"
    )
    where = node.container.run("python3", "-I", "-c", code).stdout.strip()
    assert where.startswith(f"{MODULES_DIR[FLAVOUR]}/lightkube/"), where
    shipped = set(rpm(node, "-ql", "nodeagent", "nodeagent-cli").split())
    deploy = "/usr/share/nodeagent/deploy"
    assert {
        f"{deploy}/rbac.yaml",
        f"{deploy}/admission-policy.yaml",
        f"{deploy}/opt-in/release-signatures.yaml",  # apart: kubectl apply -f deploy skips it
        f"{deploy}/crds/nodeimagestatuses.nodeagent.io.yaml",
        f"{deploy}/crds/nodeimageholdings.nodeagent.io.yaml",
        f"{deploy}/crds/pinnedimagesets.machineconfiguration.openshift.io.yaml",
    } <= shipped
    # Where the unit's Documentation= points, whatever rpm's default %{_docdir_fmt}.
    assert {"/usr/share/doc/nodeagent/cluster.md", "/usr/share/doc/nodeagent/operations.md"} <= (
        shipped
    )


async def test_erase_stops_the_service_and_unpins_without_a_dangling_link(
    package_node: Node, pushed: Pushed
) -> None:
    node = package_node
    ref = pushed.ref(pushed.base_a)
    assert (node.root / LINK).is_symlink()
    # as an import leaves it when it is cut short (the daemon writes it, decision 0042)
    sigstore_dropin = node.root / "etc/containers/registries.d/99-nodeagent-bundle-mirror.yaml"
    sigstore_dropin.parent.mkdir(parents=True, exist_ok=True)
    sigstore_dropin.write_text("docker: {}\n")
    rpm(node, "-e", "nodeagent")

    for name in ("nodeagent.service", "nodeagent-mirror.socket", "nodeagent-mirror.service"):
        unit = node.show(name, "LoadState", "ActiveState")
        assert unit == {"LoadState": "not-found", "ActiveState": "inactive"}, name
    assert not (node.root / LINK).is_symlink()
    assert not node.container.live(TARGET).exists()
    assert not sigstore_dropin.exists()
    # the store and the anti-rollback marks outlive the package
    assert (node.root / "var/lib/nodeagent/ledger.json").exists()
    assert LOCAL_CHANGE in (node.root / f"{CONFIG}.rpmsave").read_text()
    node.wait_active("crio.service")
    async with CriClient(node.cri_endpoint) as cri:

        async def is_unpinned() -> bool:
            image = await cri.image_status(ref)
            assert image is not None, "erasing nodeagent removed an image"
            return not image.is_pinned

        # The scriptlet reloaded CRI-O: the image stays, unpinned.
        await wait_for_async(is_unpinned, timeout_s=30, what="the image unpinned by the erase")

    # the command line stays for whoever still uses it; then it goes with its modules
    assert (node.root / "usr/bin/nodeagent").exists()
    rpm(node, "-e", "nodeagent-cli", MODULES_PACKAGE[FLAVOUR])
    assert not (node.root / "usr/lib/nodeagent").exists()
    node.container.reboot()
    node.wait_active("crio.service")  # nothing left behind that CRI-O fails to load

"""The container variant through a power cut, with no registry at all (issue 27's tests).

The node of tests/e2e/test_container_unit.py (what the MachineConfig carries, Debian's
podman, the first image from a stick into nodeagent's own storage). A bundle whose image
names a registry that does not exist (``registry.example:5000``: nothing on this machine
answers it) comes on an ext4 stick; the container agent imports and pins it. Then the power
is cut (``systemctl poweroff -ff``: no unit is stopped, nothing is synced by systemd),
CRI-O's storage is wiped, as CRI-O does after an unclean shutdown, and the node boots.

Proves: nodeagent runs again from its own storage (``/var/lib/nodeagent/image``, which
CRI-O never touches: decision 0070), and the set is pinned again in CRI-O from the node's
store alone, its image by the same digest. ``make container-e2e`` (container_long).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.e2e.test_container_unit import built, cnode, loaded, long_case, plug  # noqa: F401
from tests.testenv.agent import set_state
from tests.testenv.node import Node
from tests.testenv.signed_bundles import Keys, image, signed_bundle

SET = "power-drill"
REPO = Path(__file__).resolve().parents[2]


def test_the_agents_storage_is_where_crio_never_looks() -> None:
    """What the drill relies on, checked in the unit the MachineConfig installs (fast: make
    test runs it): podman keeps nodeagent's image under /var/lib/nodeagent, never in the
    containers-storage CRI-O wipes after an unclean shutdown (decision 0070)."""
    unit = (REPO / "systemd/container/nodeagent.service").read_text()
    [podman] = [
        line for line in unit.splitlines() if line.startswith("Environment=NODEAGENT_PODMAN=")
    ]
    words = podman.split()
    root = words[words.index("--root") + 1]
    assert root.startswith("/var/lib/nodeagent/image/"), podman
    assert not root.startswith("/var/lib/containers"), podman


@long_case
@pytest.mark.timeout(1800)
async def test_a_power_cut_with_crio_storage_lost_is_recovered_without_a_registry(
    cnode: Node,  # noqa: F811
    loaded: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    cnode.wait_active("nodeagent.service", timeout_s=300)
    keys = Keys.make(tmp_path / "keys")
    app = image("edge/power-drill", [(256 * 1024, 611), (64 * 1024, 612)], tmp_path / "cache")
    signed = signed_bundle(tmp_path / "bundle", keys, [app], bundle_id="power-1", set_name=SET)
    trusted = cnode.root / "etc/nodeagent/trusted-keys.d"
    for key in keys.trusted_dir.iterdir():
        shutil.copy(key, trusted / key.name)
    ref = str(signed.manifest.images[0].ref)
    assert ref.startswith("registry.example:5000/"), ref  # no registry answers this name
    media = plug(cnode, signed.root, tmp_path / "stick")
    try:
        cnode.wait_status(
            lambda s: set_state(s, SET) == "Pinned", what=f"{SET} pinned", timeout_s=600
        )
    finally:
        media.detach()

    cnode.container.run("systemctl", "poweroff", "-ff", check=False)
    cnode.container.wait_exit(120)
    storage = cnode.root / "var/lib/containers/storage"
    assert any(storage.iterdir()), "CRI-O stored nothing: the wipe would prove nothing"
    shutil.rmtree(storage)
    agent_storage = cnode.root / "var/lib/nodeagent/image/storage"
    assert any(agent_storage.iterdir())  # nodeagent's own image: CRI-O never touches it

    cnode.container.boot()
    cnode.wait_active("crio.service", "nodeagent.service", timeout_s=600)
    cnode.wait_status(
        lambda s: set_state(s, SET) == "Pinned", what=f"{SET} pinned again", timeout_s=600
    )
    async with CriClient(cnode.cri_endpoint) as cri:
        status = await cri.image_status(ref)
    assert status is not None and status.is_pinned, ref
    booted = cnode.journal("-u", "nodeagent", "-b", "-o", "cat")
    assert "restore_started" in booted and 'source="local store"' in booted, booted[-3000:]
    assert "images_restored_from_store" in booted, booted[-3000:]

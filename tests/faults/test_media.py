"""Drill: the bundle medium pulled out in the middle of an import, then plugged in again.

Real parts: systemd-udevd with a loop device carrying a signed bundle (``tests/testenv``),
CRI-O, the daemon; the bundle's own registry is gone. The removal is the one udev reports
(``udevadm trigger --action=remove``): a loop device cannot vanish while it is mounted.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import NodeFactory
from tests.faults.consistency import assert_holding, assert_node_consistent, hold_status_names
from tests.testenv.agent import set_state
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.udev import LoopMedia, Udevd, settle

pytestmark = pytest.mark.drill


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    # The seed and sizes of tests/integration/bundles' big factory: the blobs are cached.
    return build_factory(
        tmp_path_factory.mktemp("factory"), count=8, layer_bytes=16 << 20, seed=1234
    )


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


@pytest.fixture
def media(tmp_path: Path, factory: Factory) -> Iterator[LoopMedia]:
    stick = ext4_media(tmp_path, factory.bundle)
    yield stick
    if stick.devnode is not None:
        subprocess.run(["umount", "--lazy", stick.devnode], check=False)
        stick.detach()


def bundle_state(status: dict[str, Any], media: LoopMedia) -> str | None:
    """The state of the bundle on ``media`` (udev is the machine's: other tests' sticks with
    the same label may come and go, and the daemon reports those too)."""
    found = [b for b in status.get("bundles", []) if b["source"] == media.devnode]
    return str(found[-1]["state"]) if found else None


@pytest.mark.timeout(240)
async def test_medium_pulled_mid_import_leaves_the_node_consistent_and_resumes(
    udevd: Udevd,
    factory: Factory,
    media: LoopMedia,
    make_node: NodeFactory,
    drill_images: list[str],
) -> None:
    node = make_node(watch_media=True, pull_settings="concurrency = 1")
    node.agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (node.agent.trusted_keys_dir / "factory.pub").write_text(factory.public_key)
    steady = [node.ref(drill_images[0])]
    node.agent.write_set("steady", steady)
    node.agent.start()
    node.agent.wait_status(lambda s: set_state(s, "steady") == "Pinned", what="steady pinned")
    mark = node.mark()

    media.attach()
    node.agent.wait_log("image_pulled: image=" + factory.refs[0].split("/", 1)[0])
    subprocess.run(["udevadm", "trigger", "--action=remove", str(media.devnode)], check=True)
    node.agent.wait_status(lambda s: bundle_state(s, media) == "interrupted", what="interrupted")
    hold_status_names(node, "BundleMediaRemoved", for_s=2)
    node.agent.wait_log("bundle_server_stopped")
    assert not (node.crio.registries_dir / "99-nodeagent-bundle-mirror.conf").exists()
    assert list(node.agent.persistent_dir.glob("bundle-*")) == []
    await assert_holding(node, sets={"steady": steady})

    settle()
    media.trigger_add()  # plugged in again
    node.agent.wait_status(
        lambda s: bundle_state(s, media) == "pinned" and set_state(s, factory.set_name) == "Pinned",
        what="import resumed and the bundle's set pinned",
    )
    await assert_node_consistent(
        node, sets={"steady": steady, factory.set_name: factory.refs}, since=mark
    )

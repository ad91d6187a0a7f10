"""Drill: the bundle medium pulled out in the middle of an import, then plugged in again.

The medium is pulled while the bundle is copied into the node's image store (read at a
USB-like 16 MB/s through a cgroup v1 blkio throttle on the daemon): once the status says
it may be removed, removing it stops nothing (``test_store``).

Real parts: systemd-udevd with a loop device carrying a signed bundle (``tests/testenv``),
CRI-O, the daemon; the bundle's own registry is gone. The removal is the one udev reports
(``udevadm trigger --action=remove``): a loop device cannot vanish while it is mounted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.bundles import minisign
from tests.faults.conftest import NodeFactory
from tests.faults.consistency import (
    assert_holding,
    assert_node_consistent,
    hold_status_names,
    stored_images,
)
from tests.testenv import blkio
from tests.testenv.agent import set_state
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.udev import LoopMedia, Udevd, free_loop_device, settle

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


@pytest.mark.needs("blkio")
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

    devnode = free_loop_device()
    assert node.agent.process is not None
    with blkio.throttled_reads(node.agent.process.pid, devnode, 16 * 1000 * 1000):
        media.attach(devnode)  # read at 16 MB/s: the copy into the store takes seconds
        node.agent.wait_status(lambda s: bundle_state(s, media) == "storing", what="storing")
        subprocess.run(["udevadm", "trigger", "--action=remove", devnode], check=True)
        node.agent.wait_status(
            lambda s: bundle_state(s, media) == "interrupted", what="interrupted"
        )
    hold_status_names(node, "BundleMediaRemoved", for_s=2)
    assert not (node.crio.registries_dir / "99-nodeagent-bundle-mirror.conf").exists()
    assert list(node.agent.persistent_dir.glob("bundle-*")) == []
    names = {name for image in await stored_images(node) for name in image.names()}
    assert not names & set(factory.refs), "images imported before the bundle was stored"
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


def resigned_with_set_name(factory: Factory, workdir: Path, name: str) -> Path:
    """The factory's bundle, its set renamed ``name``, signed again with the factory's key."""
    bundle = workdir / "bundle"
    shutil.copytree(factory.bundle, bundle)
    doc = json.loads((bundle / "bundle.json").read_bytes())
    doc["pinnedImageSets"][0]["object"]["metadata"]["name"] = name
    data = json.dumps(doc).encode()
    (bundle / "bundle.json").write_bytes(data)
    key = minisign.parse_secret_key((factory.bundle.parent / "factory.key").read_text())
    signature = minisign.sign(data, key, trusted_comment="nodeagent bundle line-3-test")
    (bundle / "bundle.json.minisig").write_text(signature)
    return bundle


@pytest.mark.drill_long
@pytest.mark.timeout(180)
async def test_signed_bundle_with_a_path_for_a_set_name_is_refused_and_writes_nothing(
    udevd: Udevd,
    factory: Factory,
    make_node: NodeFactory,
    drill_images: list[str],
    tmp_path: Path,
) -> None:
    node = make_node(watch_media=True)
    node.agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (node.agent.trusted_keys_dir / "factory.pub").write_text(factory.public_key)
    steady = [node.ref(drill_images[0])]
    node.agent.write_set("steady", steady)
    node.agent.start()
    node.agent.wait_status(lambda s: set_state(s, "steady") == "Pinned", what="steady pinned")
    mark = node.mark()
    bundle = resigned_with_set_name(factory, tmp_path / "evil", "x/../../outside")
    stick = ext4_media(tmp_path / "evil", bundle)
    try:
        stick.attach()
        status = node.agent.wait_status(
            lambda s: bundle_state(s, stick) in ("rejected", "pinned", "imported"),
            what="the bundle judged",
        )
        judged = bundle_state(status, stick)  # by device node: read it before detaching
    finally:
        subprocess.run(["umount", "--lazy", str(stick.devnode)], check=False)
        stick.detach()
    written = sorted(str(p) for p in node.base.rglob("*outside*"))
    assert written == [], f"a bundle's set name put files at {written}"
    assert judged == "rejected"
    assert list(node.agent.persistent_dir.glob("bundle-*")) == []
    names = {name for image in await stored_images(node) for name in image.names()}
    assert not names & set(factory.refs), "images of a refused bundle were imported"
    await assert_node_consistent(node, sets={"steady": steady}, since=mark)

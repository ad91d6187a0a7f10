"""A bundle on a loop device reaches the booted node through udev: the package's rule on this
machine's systemd-udevd marks it, the unit's daemon hears the event, imports and pins it.

The node sees this machine's devices and udev the way a node sees its own: sysfs and the
udev database (``/run/udev``, bound in read-only), and udevd's broadcasts (the network
namespace is shared). nspawn gives the container a private ``/dev`` without udev inside,
so the test creates the loop device's node there before attaching the image, as devtmpfs
would on a host. What the container cannot do, and why, is in docs/testing.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.journal import MESSAGE_IDS
from tests.testenv.agent import set_state
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.node import Node
from tests.testenv.udev import Udevd, free_loop_device, udev_properties

LABEL = "NODEAGENT-E2E"


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    return build_factory(tmp_path_factory.mktemp("factory"), count=3, layer_bytes=2 << 20, seed=61)


class Stick:
    """The bundle's medium, attached to a loop device whose node exists in the container too."""

    def __init__(self, node: Node, factory: Factory, workdir: Path) -> None:
        self.node = node
        self.media = ext4_media(workdir, factory.bundle, label=LABEL)
        self.devnode = ""

    def plug(self) -> str:
        devnode = free_loop_device()
        rdev = Path(devnode).stat().st_rdev
        major, minor = os.major(rdev), os.minor(rdev)
        mknod = f"[ -b {devnode} ] || mknod {devnode} b {major} {minor}"
        self.node.container.run("sh", "-c", mknod)
        self.devnode = self.media.attach(devnode)
        self.media.wait_in_udev_db("NODEAGENT_MEDIA", "1")  # the package's rule ran
        return devnode

    def unplug(self) -> None:
        if self.devnode:
            self.media.detach()
            self.node.container.run("rm", "-f", self.devnode, check=False)
            self.devnode = ""


@pytest.fixture
def stick(node: Node, host_udevd: Udevd, factory: Factory, tmp_path: Path) -> Iterator[Stick]:
    (node.root / "etc/nodeagent/trusted-keys.d/factory.pub").write_text(factory.public_key)
    made = Stick(node, factory, tmp_path)
    try:
        yield made
    finally:
        made.unplug()
        made.media.image.unlink(missing_ok=True)


async def all_pinned(node: Node, refs: list[str]) -> bool:
    async with CriClient(node.cri_endpoint) as cri:
        images = [await cri.image_status(ref) for ref in refs]
    return all(image is not None and image.is_pinned for image in images)


async def test_bundle_medium_is_imported_through_the_udev_rule_and_the_unit(
    node: Node, factory: Factory, stick: Stick
) -> None:
    plugged = stick.plug()
    props = udev_properties(plugged)
    assert ":systemd:" in props["TAGS"]
    assert props["SYSTEMD_WANTS"] == "nodeagent.service"
    assert props["UDISKS_IGNORE"] == "1"

    status = node.wait_status(
        lambda s: (
            any(b["state"] == "pinned" for b in s.get("bundles", []))
            and set_state(s, factory.set_name) == "Pinned"
        ),
        what="the bundle imported and its set pinned",
    )
    bundle = next(b for b in status["bundles"] if b["state"] == "pinned")
    assert bundle["bundleId"] == "line-3-test"
    assert await all_pinned(node, factory.refs)

    arrived = node.journal_entries("-u", "nodeagent", "NODEAGENT_EVENT=media_arrived")
    assert any(plugged in e["MESSAGE"] and "udev_rule=True" in e["MESSAGE"] for e in arrived)
    detected = node.journal_entries(f"NODEAGENT_DEVICE={plugged}")
    assert detected[0]["MESSAGE_ID"] == MESSAGE_IDS["bundle_media_detected"]
    events = {e["NODEAGENT_EVENT"] for e in node.journal_entries("NODEAGENT_BUNDLE_ID=line-3-test")}
    assert {"bundle_verified", "bundle_imported"} <= events
    explained = node.journal("-x", "-u", "nodeagent", f"NODEAGENT_DEVICE={plugged}")
    assert "Subject: An upgrade bundle was plugged in" in explained
    assert f"was found on {plugged}" in explained


async def test_medium_plugged_while_the_unit_is_stopped_is_taken_when_it_starts(
    node: Node, factory: Factory, stick: Stick
) -> None:
    """What udev's SYSTEMD_WANTS starts the unit for: media already present at start."""
    node.container.systemctl("stop", "nodeagent.service")
    try:
        plugged = stick.plug()
    finally:
        node.container.systemctl("start", "nodeagent.service")
    detected = node.wait_event("bundle_media_detected")
    assert detected["NODEAGENT_DEVICE"] == plugged
    # Imported by the test before, or now when this test runs alone.
    done = node.wait_event("bundle_already_imported", "bundle_imported")
    assert done["NODEAGENT_BUNDLE_ID"] == "line-3-test"
    assert await all_pinned(node, factory.refs)

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

from nodeagent.adapters.cri import CriClient
from nodeagent.journal import MESSAGE_IDS
from tests.testenv.agent import set_state
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.node import Node
from tests.testenv.udev import LoopMedia, Udevd, free_loop_device, udev_properties

LABEL = "NODEAGENT-E2E"


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    return build_factory(tmp_path_factory.mktemp("factory"), count=3, layer_bytes=2 << 20, seed=61)


@pytest.fixture
def plugged(node: Node, host_udevd: Udevd, factory: Factory, tmp_path: Path) -> Iterator[str]:
    """The bundle's medium attached to a loop device whose node exists in the container too."""
    if not host_udevd.is_owned:
        pytest.skip("a systemd-udevd the tests did not start is running: its rules are not ours")
    keys = node.root / "etc/nodeagent/trusted-keys.d"
    (keys / "factory.pub").write_text(factory.public_key)
    media = ext4_media(tmp_path, factory.bundle, label=LABEL)
    devnode = free_loop_device()
    rdev = Path(devnode).stat().st_rdev
    major, minor = str(os.major(rdev)), str(os.minor(rdev))
    node.container.run("sh", "-c", f"[ -b {devnode} ] || mknod {devnode} b {major} {minor}")
    media.attach(devnode)
    try:
        yield devnode
    finally:
        cleanup(node, media, devnode)


def cleanup(node: Node, media: LoopMedia, devnode: str) -> None:
    media.detach()
    media.image.unlink(missing_ok=True)
    node.container.run("rm", "-f", devnode, check=False)


async def test_bundle_medium_is_imported_through_the_udev_rule_and_the_unit(
    node: Node, factory: Factory, plugged: str
) -> None:
    media = LoopMedia(Path("unused"))
    media.devnode = plugged
    media.wait_in_udev_db("NODEAGENT_MEDIA", "1")  # the package's rule ran on the event
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
    async with CriClient(node.cri_endpoint) as cri:
        images = [await cri.image_status(ref) for ref in factory.refs]
    assert all(image is not None and image.is_pinned for image in images)

    arrived = node.journal_entries("-u", "nodeagent", "NODEAGENT_EVENT=media_arrived")
    assert any(plugged in e["MESSAGE"] and "udev_rule=True" in e["MESSAGE"] for e in arrived)
    detected = node.journal_entries(f"NODEAGENT_DEVICE={plugged}")
    assert detected[0]["MESSAGE_ID"] == MESSAGE_IDS["bundle_media_detected"]
    events = {e["NODEAGENT_EVENT"] for e in node.journal_entries("NODEAGENT_BUNDLE_ID=line-3-test")}
    assert {"bundle_verified", "bundle_imported"} <= events
    explained = node.journal("-x", "-u", "nodeagent", f"NODEAGENT_DEVICE={plugged}")
    assert "Subject: An upgrade bundle was plugged in" in explained
    assert f"was found on {plugged}" in explained

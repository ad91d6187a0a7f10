"""Drill (issue 30 item 5): the stick yanked during the store copy on every node of a site, in
turn.

Three node namespaces on a bridge, each with its own CRI-O, daemon and unprivileged peer
process (``tests/testenv/site_stick.py``), every node watching for media; no registry (a
listener on the images' registry address in each namespace counts connections:
``test_site.RegistryWatch``). One stick, and one udevd that is moved from node to node
(``Udevd.move``): the stick is plugged into node 0, then node 1, then node 2. On each, the
daemon reads it at a USB-like ``STICK_BYTES_PER_S`` (``tests/testenv/blkio.py``: about
2.7 MB of the 10 MiB are read when the pull lands), and the stick is pulled as soon as the
status says the bundle is being copied into the store: its reads fail from then on and udev
reports the removal (``pull``). At the end the stick is plugged into node 1 once more and
left in.

Proves, after each yank: the bundle is ``interrupted`` and the journal says the medium was
removed (``bundle_interrupted``, ``BundleMediaRemoved``); the daemon holds no mount of the
stick; the copy did not finish behind the interrupted import; nothing of the bundle is
served to the peers (no signed manifest in the node's store, no peer started fetching it)
nor imported into CRI-O. At the end every node pins the bundle, node 1 from the stick and
the others from their peers (in the runs so far each cut copy had stored the 2 MiB base
blob, which neither the stick's second copy nor the fetches read again), and no node made a
connection to the registry.
About 12 s (``make test`` runs it), plus 0.3 s for the check of the moving udevd.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.test_media import bundle_state
from tests.faults.test_site import RegistryWatch, registry_address
from tests.faults.test_site_disk import stored
from tests.testenv import blkio
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.site_net import SiteNetUnavailable, SiteNetwork
from tests.testenv.site_node import STATE_DIR, SiteNode
from tests.testenv.site_pki import make_ca
from tests.testenv.site_stick import bundle_pinned, fanout_nodes, start_fanout, stick_site_udevd
from tests.testenv.udev import LoopMedia, Udevd, free_loop_device, settle
from tests.testenv.waiting import log_tail, wait_for

pytestmark = pytest.mark.drill

STICK_BYTES_PER_S = 2 * 1000 * 1000
"""The stick's read rate while it is yanked: the bundle (about 10 MiB) takes seconds."""


@contextlib.contextmanager
def roaming_stick_site(tmp_path: Path, n: int) -> Iterator[tuple[SiteNetwork, Udevd]]:
    """``stick_site_udevd``; the test skips, naming the probe, where it cannot run."""
    with contextlib.ExitStack() as stack:
        try:
            site = stack.enter_context(stick_site_udevd(tmp_path, n))
        except SiteNetUnavailable as exc:
            pytest.skip(str(exc))
        yield site


def udev_monitor(host_prefix: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``udevadm monitor --udev`` in a namespace: the events udevd broadcasts there."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [*host_prefix, "udevadm", "monitor", "--udev", "--subsystem-match=block"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_the_moved_udevd_tells_only_its_new_node(tmp_path: Path) -> None:
    """The fast check ``make test`` runs: once udevd is moved to node 1's namespace, an event
    of the stick reaches node 1 and not node 0 (each node's daemon hears udevd's broadcasts in
    its own network namespace only)."""
    with roaming_stick_site(tmp_path, 2) as (net, udevd):
        udevd.move(net.hosts[1].exec_prefix)
        logs = [tmp_path / f"monitor-{h.index}" for h in net.hosts]
        monitors = [
            udev_monitor(h.exec_prefix, log) for h, log in zip(net.hosts, logs, strict=True)
        ]
        stick = LoopMedia.create(tmp_path / "stick", "ext4", label="MOVECHECK")
        try:
            wait_for(
                lambda: all("UDEV" in log.read_text() for log in logs),
                timeout_s=20,
                what="both monitors listening",
            )
            devnode = stick.attach()
            stick.trigger_add()
            settle()
            name = Path(devnode).name
            heard = re.compile(rf"^UDEV .* add +/devices/virtual/block/{name} ", re.MULTILINE)
            wait_for(
                lambda: heard.search(logs[1].read_text()),
                timeout_s=20,
                what="node 1 hearing of the stick",
                detail=lambda: logs[1].read_text()[-2000:],
            )
            assert name not in logs[0].read_text(), logs[0].read_text()
        finally:
            for monitor in monitors:
                monitor.kill()
                monitor.wait()
            stick.detach()


def no_mount_of(node: SiteNode, devnode: str) -> bool:
    """Whether the daemon's mount namespace holds no mount of ``devnode``."""
    assert node.process is not None
    mounts = Path(f"/proc/{node.process.pid}/mountinfo").read_text()
    return f" {devnode} " not in mounts


def fetches_started(node: SiteNode) -> int:
    return node.current_run_log().count("bundle_fetch_started")


def pull(stick: LoopMedia) -> None:
    """What pulling a stick out does to its reader: every read from now on fails (the device
    shrinks to nothing: ``losetup --set-capacity`` over an emptied image), and udev reports
    the removal. A loop device cannot vanish while it is mounted; without the first step the
    daemon's copy, which runs in a thread, would read on to the end and store the whole
    bundle behind the import it belonged to (found by this drill: see docs/testing.md)."""
    assert stick.devnode is not None
    os.truncate(stick.image, 0)
    subprocess.run(["losetup", "--set-capacity", stick.devnode], check=True)
    subprocess.run(["udevadm", "trigger", "--action=remove", stick.devnode], check=True)


def yank_mid_copy(node: SiteNode, image: Path, peers: list[SiteNode], factory: Factory) -> None:
    """Plug a copy of the stick's image into ``node``, read slowly; pull it while the bundle
    is being stored; check what the node and its peers are left with."""
    assert node.process is not None
    copy = image.with_name(f"{image.stem}-{node.name}.img")
    subprocess.run(["cp", "--sparse=always", str(image), str(copy)], check=True)
    stick, devnode = LoopMedia(copy), free_loop_device()
    with blkio.throttled_reads(node.process.pid, devnode, STICK_BYTES_PER_S):
        stick.attach(devnode)
        node.wait_status(lambda s: bundle_state(s, stick) == "storing", what="storing")
        pull(stick)
        status = node.wait_status(
            lambda s: bundle_state(s, stick) == "interrupted", what="interrupted"
        )
    entry = [b for b in status["bundles"] if b["source"] == devnode][-1]
    assert entry["reason"] == "BundleMediaRemoved", entry
    log = node.current_run_log()
    assert "bundle_interrupted" in log and "reason=BundleMediaRemoved" in log, log[-3000:]
    wait_for(
        lambda: no_mount_of(node, devnode),
        timeout_s=30,
        what=f"{node.name} letting go of the stick's mount",
        detail=lambda: log_tail(node.log_path),
    )
    subprocess.run(["umount", "--lazy", devnode], check=False, capture_output=True)
    stick.detach()
    assert "store_copy_finished" not in node.current_run_log(), "the yank came after the copy"
    manifests = sorted(node.path(f"/{STATE_DIR}/store/bundles").glob("*/bundle.json"))
    assert manifests == [], f"{node.name} stored a manifest of a bundle it did not finish"
    assert [fetches_started(p) for p in peers] == [0] * len(peers), "a peer fetched a half copy"
    assert not bundle_pinned(status, factory.set_name)
    names = {name for image in asyncio.run(stored(node)) for name in image.names()}
    assert not names & set(factory.refs), f"{node.name} imported images of a half copy"
    copy.unlink()


@pytest.mark.needs("blkio")
@pytest.mark.timeout(300)
def test_the_stick_yanked_mid_copy_on_each_node_in_turn_then_the_site_pins_it(
    tmp_path: Path,
) -> None:
    factory = build_factory(tmp_path / "factory", count=2, layer_bytes=4 << 20, seed=3052)
    ca = make_ca("site CA")
    with roaming_stick_site(tmp_path, 3) as (net, udevd):
        nodes = fanout_nodes(tmp_path, net, ca, factory.public_key, stick_nodes=range(3))
        watches = [
            RegistryWatch(h, registry_address(factory), tmp_path / f"registry-watch-{h.index}")
            for h in net.hosts
        ]
        stick = ext4_media(tmp_path, factory.bundle)
        try:
            start_fanout(nodes)
            for node in nodes:
                udevd.move(node.host.exec_prefix)
                yank_mid_copy(node, stick.image, [p for p in nodes if p is not node], factory)

            # ---- plugged into node 1 once more, and left in
            udevd.move(nodes[1].host.exec_prefix)
            stick.attach()
            for node in nodes:
                node.wait_status(
                    lambda s: bundle_pinned(s, factory.set_name), what="pinned", timeout_s=300
                )
            fetched = ["bundle_fetched:" in node.current_run_log() for node in nodes]
            assert fetched == [True, False, True], fetched  # node 1 from the stick, not its peers
            assert [w.connections() for w in watches] == [0, 0, 0]  # no registry, ever
        finally:
            if stick.devnode is not None:
                subprocess.run(["umount", "--lazy", stick.devnode], check=False)
                stick.detach()
            for watch in watches:
                watch.close()
            for node in nodes:
                node.close()

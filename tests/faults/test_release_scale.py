"""Drill at release scale (issue 31): a release-shaped bundle through the daemon from a stick
pulled out halfway through its copy, plugged in again, and the power cut while the images
are imported: nothing is lost, and the medium is read again only for what was missing.

The release is ``bench/scale_release.py``'s: 180 payload images, each an index of two
architectures, about 790 blobs with shared base layers, built by ``bundle create
--release`` from a loopback registry that is gone before the stick is plugged in.
``NODEAGENT_SCALE_DRILL_GIB`` chooses its size (GiB of compressed blobs of one
architecture; 0.25 by default: the counts of a real release, not its bytes). ``make test``
runs a sample of the same shape with 12 images; ``make drills`` the whole release.

Real parts: systemd-udevd with the stick on a loop device, read at a stick's rate through a
cgroup v1 blkio throttle on the daemon; CRI-O; the daemon; the power cut and the boot are
``DrillNode``'s (both SIGKILLed, ``/run`` and every mount lost, the units' start order).
What the medium gave is counted by the kernel (``/sys/block/<loop>/stat``), the page cache
dropped at the power cut.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from bench.bundle_import import drop_caches, sectors_read
from bench.release_scale import pushed_release
from bench.scale_measure import GIB
from bench.scale_release import IMAGES, plan_release
from bench.scale_steps import step_create
from nodeagent.adapters.store import keeper
from nodeagent.units import format_bytes
from tests.faults.conftest import NodeFactory
from tests.faults.consistency import assert_node_consistent
from tests.faults.node import DrillNode
from tests.faults.test_store import bundle_entry, store_dir, wait_all_pinned
from tests.testenv import blkio
from tests.testenv.agent import set_state
from tests.testenv.bundles import ext4_media
from tests.testenv.registry import Registry
from tests.testenv.udev import LoopMedia, Udevd, free_loop_device
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.drill

LABEL = "NODEAGENTSCALE1"
STICK_BYTES_PER_S = 30 * 1000 * 1000
"""A USB 2 stick's read rate (the copy of 0.25 GiB takes about 9 s), slower for a small
sample so that its copy takes ``MIN_COPY_S`` and the status is seen halfway."""
MIN_COPY_S = 6.0
SAMPLE_GIB, SAMPLE_IMAGES = 0.02, 12
SLACK_BYTES = 24 << 20
"""Reads beyond the blobs: the filesystem's metadata, the signed manifest and its
signature at each plug-in, the blob in progress at the pull and at the cut read again."""


@dataclass(frozen=True)
class ReleaseStick:
    media: LoopMedia
    public_key: str
    refs: list[str]
    set_name: str
    blob_bytes: int

    @property
    def read_rate(self) -> float:
        """Bytes a second the stick gives the daemon."""
        return min(STICK_BYTES_PER_S, self.blob_bytes / MIN_COPY_S)


@pytest.fixture(scope="module")
def release_stick(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReleaseStick]:
    """``request.param``: "release" (``NODEAGENT_SCALE_DRILL_GIB``, 180 images) or
    "sample" (12 images)."""
    if request.param == "sample":
        size_gib, images = SAMPLE_GIB, SAMPLE_IMAGES
    else:
        size_gib, images = float(os.environ.get("NODEAGENT_SCALE_DRILL_GIB", "0.25")), IMAGES
    work = tmp_path_factory.mktemp("release")
    bundle = work / "bundle"
    with Registry(work / "registry") as registry:
        plans = plan_release(int(size_gib * GIB), seed=31, images=images)
        ctx, _ = pushed_release(work, work, registry, plans, f"{size_gib:g}")
        step_create(ctx, bundle, with_baseline=False)
    doc = json.loads((bundle / "bundle.json").read_text())
    stick = ext4_media(work, bundle, label=LABEL)
    shutil.rmtree(bundle)
    yield ReleaseStick(
        stick,
        ctx.public_key,
        [image["name"] for image in doc["images"]],
        doc["pinnedImageSets"][0]["object"]["metadata"]["name"],
        sum(blob["sizeBytes"] for blob in doc["blobs"]),
    )
    if stick.devnode is not None:
        stick.detach()


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


def copied(status: dict[str, Any], devnode: str) -> float:
    """The fraction of the store copy done, as the status last reported it."""
    progress = bundle_entry(status, devnode).get("progress") or {}
    total = progress.get("totalBytes") or 0
    return float(progress.get("doneBytes", 0)) / total if total else 0.0


def stored_bytes(node: DrillNode) -> int:
    blobs = store_dir(node) / "blobs" / "sha256"
    return sum(p.stat().st_size for p in blobs.iterdir()) if blobs.is_dir() else 0


def read_bytes(devnode: str, since: int) -> int:
    return (sectors_read(devnode) - since) * 512


@pytest.mark.needs("blkio")
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "release_stick",
    ["sample", pytest.param("release", marks=pytest.mark.drill_long)],
    indirect=True,
)
async def test_a_release_stick_pulled_halfway_then_a_power_cut_loses_nothing(
    udevd: Udevd, release_stick: ReleaseStick, make_node: NodeFactory
) -> None:
    stick, total = release_stick.media, release_stick.blob_bytes
    node = make_node(watch_media=True, extra_config=f'label_pattern = "{LABEL}"\n')
    node.agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (node.agent.trusted_keys_dir / "release.pub").write_text(release_stick.public_key)
    node.agent.start()
    node.notify.wait_ready()
    rate = release_stick.read_rate
    timeout_s = 120 + 8 * MIN_COPY_S + 4 * total / rate

    # 1. Plugged in; pulled out once half the bundle is in the store.
    first = free_loop_device()
    since = sectors_read(first)
    assert node.agent.process is not None
    with blkio.throttled_reads(node.agent.process.pid, first, int(rate)):
        stick.attach(first)
        node.agent.wait_status(lambda s: copied(s, first) >= 0.5, what="half the bundle stored",
                               timeout_s=timeout_s)  # fmt: skip
        read_first = read_bytes(first, since)
        stick.unplug()
    node.agent.wait_status(lambda s: bundle_entry(s, first).get("state") == "interrupted",
                           what="the import interrupted")  # fmt: skip
    held = stored_bytes(node)
    assert total // 3 <= held < total, f"{format_bytes(held)} of {format_bytes(total)} stored"

    # 2. Plugged in again (read as slowly, so that the rest takes as long); the power cut
    #    once half the rest is in and images are pulled again.
    second = free_loop_device()
    since = sectors_read(second)
    resumed = node.mark()
    slower = min(rate, (total - held) / MIN_COPY_S)

    def cut_now() -> bool:
        status = node.agent.status()
        pulled = "image_pulled" in node.agent_log_since(resumed)
        return pulled and status is not None and copied(status, second) >= 0.5

    with blkio.throttled_reads(node.agent.process.pid, second, int(slower)):
        stick.attach(second)
        wait_for(cut_now, timeout_s=timeout_s, what="half the rest stored, images pulled")
        read_second = read_bytes(second, since)
        node.power_cut(is_store_lost=False)
    drop_caches()  # what the medium gives after the boot is read from it

    # 3. The boot, the stick still in: the import resumes from what the store holds.
    since = sectors_read(second)
    booted = node.mark()
    node.boot()
    await wait_all_pinned(node, release_stick.refs, timeout_s=timeout_s)
    node.agent.wait_status(
        lambda s: set_state(s, release_stick.set_name) == "Pinned", what="the release set pinned"
    )
    read_after_boot = read_bytes(second, since)

    missing = total - held
    again = read_second + read_after_boot
    print(  # the figures for the note (pytest -s)
        f"release {format_bytes(total)}: read {format_bytes(read_first)} before the pull, "
        f"{format_bytes(held)} stored; then {format_bytes(read_second)} before the cut and "
        f"{format_bytes(read_after_boot)} after the boot = {again / missing:.3f} x the missing "
        f"{format_bytes(missing)}; all read {(read_first + again) / total:.3f} x the blobs"
    )
    assert again <= missing + SLACK_BYTES, "the medium was read again for what was stored"
    assert read_first + again <= total + 2 * SLACK_BYTES
    verified = keeper.verify(store_dir(node))
    assert verified.is_ok, verified.corrupt
    await assert_node_consistent(
        node, sets={release_stick.set_name: release_stick.refs}, since=booted
    )

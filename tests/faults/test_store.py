"""Drills of the node's image store (issue 14): the stick leaves early, and pinned images
come back after a power cut with no registry and no stick.

Real parts: systemd-udevd with loop devices carrying signed bundles, CRI-O, the daemon.
The bundles' images are named after a "dead registry": a ``FaultyProxy`` that answers 503
to every request and records it, so a drill counts that no request reached any registry
(the session registry's proxy of the drilled node is counted too). The sticks carry a
label of their own (``NODEAGENTSTORE1``) and the daemon watches only that label: other
tests' sticks on this machine's udev are not imported here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.units import format_bytes
from tests.faults.conftest import NodeFactory
from tests.faults.consistency import assert_node_consistent
from tests.faults.node import DrillNode, pins_of
from tests.faults.test_power import _drop_image_records
from tests.testenv.agent import set_state
from tests.testenv.bundles import ext4_media
from tests.testenv.faulty_proxy import FaultyProxy
from tests.testenv.images import BuiltImage, default_cache_dir
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle
from tests.testenv.udev import LoopMedia, Udevd
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.drill

MIB = 1 << 20
LABEL = "NODEAGENTSTORE1"
STORE_CONFIG = f'label_pattern = "{LABEL}"\n'


@pytest.fixture(scope="module")
def dead_registry() -> Iterator[FaultyProxy]:
    """Where the bundles' images say they come from: 503 to everything, every request kept."""
    proxy = FaultyProxy("127.0.0.1:9")
    proxy.start()
    proxy.answer_errors(503)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys.make(tmp_path_factory.mktemp("keys"))


def _images(names_and_own_seeds: list[tuple[str, int]]) -> list[BuiltImage]:
    """Images of a 2 MiB base they share and a 12 MiB layer of their own (cached layers)."""
    cache = default_cache_dir()
    return [
        image(name, [(2 * MIB, 1400), (12 * MIB, seed)], cache)
        for name, seed in names_and_own_seeds
    ]


@pytest.fixture(scope="module")
def bundle(
    tmp_path_factory: pytest.TempPathFactory, keys: Keys, dead_registry: FaultyProxy
) -> Signed:
    """Four images, about 56 MiB, set ``line-store``."""
    images = _images([(f"store/app{i}", 1410 + i) for i in range(4)])
    root = tmp_path_factory.mktemp("bundle") / "bundle"
    return signed_bundle(
        root, keys, images, bundle_id="store-a", set_name="line-store", host=dead_registry.host
    )


def refs_of(signed: Signed) -> list[str]:
    return [str(image.ref) for image in signed.manifest.images]


@dataclass
class Drill:
    """A drilled node watching for the store drills' sticks, and what it must not touch."""

    node: DrillNode
    dead: FaultyProxy
    tmp_path: Path
    sticks: list[LoopMedia]

    def registry_requests(self) -> list[str]:
        """Every request that reached the bundles' registry or the session registry's proxy."""
        return [
            f"{where}: {x.request.method} {x.request.path} ({x.request.user_agent})"
            for where, proxy in (("bundles' registry", self.dead), ("proxy", self.node.proxy))
            for x in proxy.exchanges()
        ]

    def plug(self, signed: Signed) -> LoopMedia:
        workdir = self.tmp_path / f"stick{len(self.sticks)}"
        workdir.mkdir()
        stick = ext4_media(workdir, signed.root, label=LABEL)
        self.sticks.append(stick)
        stick.attach()
        return stick

    def unplug(self, stick: LoopMedia) -> None:
        """What pulling the stick out does (``LoopMedia.unplug``)."""
        stick.unplug()

    def wait_pinned(self, stick: LoopMedia, set_name: str) -> dict[str, Any]:
        devnode = stick.devnode
        return self.node.agent.wait_status(
            lambda s: (
                bundle_entry(s, devnode or "").get("state") in ("imported", "pinned")
                and set_state(s, set_name) == "Pinned"
            ),
            what=f"the bundle on {devnode} imported and {set_name} pinned",
        )


def bundle_entry(status: dict[str, Any], source: str) -> dict[str, Any]:
    found = [b for b in status.get("bundles", []) if b.get("source") == source]
    return dict(found[-1]) if found else {}


@pytest.fixture
def drill(
    make_node: NodeFactory,
    *,
    udevd: Udevd,
    dead_registry: FaultyProxy,
    keys: Keys,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Drill]:
    extra = getattr(request, "param", "")
    node = make_node(
        watch_media=True,
        extra_config=STORE_CONFIG + extra,
        insecure_registries=[dead_registry.host],
    )
    node.agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    for pub in keys.trusted_dir.glob("*.pub"):
        (node.agent.trusted_keys_dir / pub.name).write_text(pub.read_text())
    drilled = Drill(node, dead_registry, tmp_path, [])
    yield drilled
    for stick in drilled.sticks:
        if stick.devnode is not None:
            subprocess.run(["umount", "--lazy", stick.devnode], check=False, capture_output=True)
            stick.detach()


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


async def wait_all_pinned(node: DrillNode, refs: list[str], *, timeout_s: float) -> float:
    """Poll CRI until every one of ``refs`` is stored and pinned; the seconds it took."""
    started = time.monotonic()
    async with CriClient(node.crio.endpoint, timeout_s=30) as cri:
        while True:
            found = [await cri.image_status(ref) for ref in refs]
            if all(image is not None and image.is_pinned for image in found):
                return time.monotonic() - started
            missing = [r for r, i in zip(refs, found, strict=True) if i is None or not i.is_pinned]
            assert time.monotonic() - started < timeout_s, f"not back and pinned: {missing}"
            await asyncio.sleep(0.2)


# ---------------------------------------------------------------- a. the stick leaves early
@pytest.mark.timeout(150)
async def test_stick_removed_as_soon_as_stored_the_import_completes_from_the_store(
    drill: Drill, bundle: Signed
) -> None:
    node = drill.node
    node.agent.start()
    node.notify.wait_ready()
    mark = node.mark()
    stick = drill.plug(bundle)
    devnode = stick.devnode or ""
    node.agent.wait_status(
        lambda s: bundle_entry(s, devnode).get("mediumRemovable") is True,
        what="the status saying the medium may be removed",
    )
    drill.unplug(stick)  # at once
    assert any("the medium may be removed" in line for line in node.notify.statuses()), (
        "no STATUS= line said the medium may be removed"
    )
    node.agent.wait_status(
        lambda s: set_state(s, "line-store") == "Pinned",
        what="the bundle's set pinned with the stick gone",
    )
    log = node.agent_log_since(mark)
    assert "bundle_interrupted" not in log
    assert "bundle_imported" in log
    assert drill.registry_requests() == []
    await assert_node_consistent(node, sets={"line-store": refs_of(bundle)}, since=mark)


# ---------------------------------------------------------------- b. a power cut, no registry
async def imported_then_stick_gone(drill: Drill, signed: Signed, set_name: str) -> None:
    node = drill.node
    node.agent.start()
    node.notify.wait_ready()
    stick = drill.plug(signed)
    drill.wait_pinned(stick, set_name)
    drill.unplug(stick)


def cut_power(node: DrillNode, refs: list[str], *, is_wiped: bool) -> None:
    """Both SIGKILLed, ``/run`` lost; CRI-O's storage deleted, or only ``refs``' records."""
    node.power_cut(is_store_lost=is_wiped)
    if not is_wiped:
        _drop_image_records(node.crio.storage_root, refs)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "is_wiped",
    [True, pytest.param(False, marks=pytest.mark.drill_long)],
    ids=["storage-wiped", "two-images-repaired-away"],
)
async def test_power_cut_with_no_registry_and_no_stick_every_pinned_image_comes_back(
    drill: Drill, bundle: Signed, is_wiped: bool
) -> None:
    node, refs = drill.node, refs_of(bundle)
    await imported_then_stick_gone(drill, bundle, "line-store")
    cut_power(node, refs[1:3], is_wiped=is_wiped)
    mark = node.mark()
    node.boot()
    back_s = await wait_all_pinned(node, refs, timeout_s=60)
    node.agent.wait_log("images_restored_from_store", timeout_s=30)  # once the session ended
    log = node.agent_log_since(mark)
    reason = "RuntimeStorageWiped" if is_wiped else "RuntimeImagesLost"
    assert f"pinned_images_lost: reason={reason}" in log
    lost = len(refs) if is_wiped else 2
    assert f"restored {lost} images from the local store" in log
    status = node.agent.wait_status(
        lambda s: "imageLoss" in s and set_state(s, "line-store") == "Pinned",
        what="the set pinned again, the loss in the status",
    )
    assert status["imageLoss"]["reason"] == reason
    assert status["imageLoss"]["restoredFromStore"] == lost
    assert drill.registry_requests() == []
    assert all(stick.devnode is None for stick in drill.sticks)
    await assert_node_consistent(node, sets={"line-store": refs}, since=mark)
    assert back_s < 30, f"{back_s:.1f} s from CRI-O answering to every image back"


# ---------------------------------------------------------------- c. killed while restoring
@pytest.mark.drill_long
@pytest.mark.timeout(240)
async def test_daemon_killed_while_restoring_then_booted_again_brings_all_back(
    drill: Drill, bundle: Signed
) -> None:
    node, refs = drill.node, refs_of(bundle)
    await imported_then_stick_gone(drill, bundle, "line-store")
    cut_power(node, refs, is_wiped=True)
    node.boot()
    node.agent.wait_log("source=store", timeout_s=60)  # the first image back from the store
    node.power_cut(is_store_lost=False)
    mark = node.mark()
    node.boot()
    await wait_all_pinned(node, refs, timeout_s=60)
    node.agent.wait_status(
        lambda s: set_state(s, "line-store") == "Pinned", what="the set pinned again"
    )
    node.agent.wait_log("images_restored_from_store", timeout_s=30)  # once the session ended
    assert drill.registry_requests() == []
    await assert_node_consistent(node, sets={"line-store": refs}, since=mark)


# ---------------------------------------------------------------- d. a corrupt blob
def store_dir(node: DrillNode) -> Path:
    return node.agent.state_dir / "store"


def own_layer(signed: Signed, index: int) -> str:
    """The digest of image ``index``'s own (largest) layer."""
    layers = signed.images[index].layers
    return max(layers, key=lambda layer: layer.size_bytes).digest


@pytest.mark.drill_long
@pytest.mark.timeout(240)
async def test_corrupt_store_blob_is_refused_reported_removed_and_fetched_again(
    drill: Drill, bundle: Signed
) -> None:
    node, refs = drill.node, refs_of(bundle)
    await imported_then_stick_gone(drill, bundle, "line-store")
    digest = own_layer(bundle, 1)
    blob = store_dir(node) / "blobs" / "sha256" / digest.removeprefix("sha256:")
    with blob.open("r+b") as damaged:  # flip bytes in the middle; the size stays
        damaged.seek(blob.stat().st_size // 2)
        data = damaged.read(16)
        damaged.seek(blob.stat().st_size // 2)
        damaged.write(bytes(b ^ 0xFF for b in data))
    node.crio.kill()  # and its storage wiped: every layer must come from the store again
    shutil.rmtree(node.crio.storage_root)
    mark = node.mark()
    node.crio.start()
    node.agent.wait_log("store_blob_refused", timeout_s=60)
    node.agent.wait_status(
        lambda s: set_state(s, "line-store") not in (None, "Pinned"),
        what="the set reported incomplete",
    )
    async with CriClient(node.crio.endpoint, timeout_s=30) as cri:
        assert await cri.image_status(refs[1]) is None, "an image of a corrupt blob was stored"
    status = node.agent.status() or {}
    assert status["imageLoss"]["resolved"] is False, status.get("imageLoss")
    assert refs[1] in pins_of(node.link.read_text()), "the lost image's pin was dropped"

    verified = node.agent.cli("store", "verify", "--json")
    assert verified.returncode == 74, verified.stdout + verified.stderr
    assert digest.removeprefix("sha256:") in verified.stdout
    assert not blob.exists()
    again = node.agent.cli("store", "verify", "--json")
    assert again.returncode == 0, again.stdout + again.stderr

    replug = node.mark()
    stick = drill.plug(bundle)
    wait_for(
        lambda: "bundle_stored" in node.agent_log_since(replug),
        timeout_s=60,
        what="the missing blob copied again",
        detail=lambda: node.agent_log_since(replug)[-3000:],
    )
    size = blob.stat().st_size
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest.removeprefix("sha256:")
    storing = [line for line in node.agent_log_since(mark).splitlines() if "bundle_storing" in line]
    assert storing, "the copy did not run"
    assert _size_text(size) in storing[-1], f"not only the blob ({size} bytes): {storing[-1]}"
    copies = [
        line for line in node.agent_log_since(replug).splitlines() if "store_copy_started" in line
    ]
    assert copies and " blobs=1 " in copies[-1], copies
    drill.unplug(stick)
    await wait_all_pinned(node, refs, timeout_s=60)
    node.agent.wait_status(
        lambda s: set_state(s, "line-store") == "Pinned", what="the set pinned again"
    )
    await assert_node_consistent(node, sets={"line-store": refs}, since=mark)


def _size_text(size: int) -> str:
    return format_bytes(size)


# ---------------------------------------------------------------- e. shared layers, gc
def stored_blobs(node: DrillNode) -> set[str]:
    directory = store_dir(node) / "blobs" / "sha256"
    return {f"sha256:{p.name}" for p in directory.iterdir()}


def blobs_of(signed: Signed) -> set[str]:
    return set(signed.manifest.blobs)


@pytest.mark.drill_long
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "drill",
    [pytest.param("[store]\ngc_grace_s = 0\nkeep_newest_per_channel = false\n", id="grace-0")],
    indirect=True,
)
async def test_two_bundles_share_layers_once_and_removing_one_set_frees_only_its_own(
    drill: Drill, bundle: Signed, keys: Keys, dead_registry: FaultyProxy, tmp_path: Path
) -> None:
    node = drill.node
    other_images = _images([("store/app0", 1410), ("store/other", 1420)])  # app0 as in bundle
    other = signed_bundle(
        tmp_path / "other",
        keys,
        other_images,
        bundle_id="store-b",
        set_name="line-other",
        host=dead_registry.host,
        created="2026-02-01T00:00:00Z",
    )
    await imported_then_stick_gone(drill, bundle, "line-store")
    stick = drill.plug(other)
    drill.wait_pinned(stick, "line-other")
    drill.unplug(stick)
    shared, own = blobs_of(bundle) & blobs_of(other), blobs_of(other) - blobs_of(bundle)
    assert shared and own
    assert stored_blobs(node) == blobs_of(bundle) | blobs_of(other)
    blob_files = (store_dir(node) / "blobs" / "sha256").iterdir()
    store_bytes = sum(p.stat().st_size for p in blob_files)
    sizes = {**bundle.manifest.blobs, **other.manifest.blobs}
    assert store_bytes == sum(f.size_bytes for f in sizes.values())  # each blob once

    (node.agent.persistent_dir / "bundle-store-b-line-other.yaml").unlink()
    node.agent.wait_status(
        lambda s: set_state(s, "line-other") is None, what="the other set removed"
    )
    wait_for(
        lambda: not (own & stored_blobs(node)),
        timeout_s=60,
        what="the other bundle's own blobs collected",
        detail=lambda: json.dumps(sorted(own & stored_blobs(node))),
    )
    assert stored_blobs(node) == blobs_of(bundle)
    assert (store_dir(node) / "bundles" / "store-b" / "bundle.json").exists()
    await assert_node_consistent(node, sets={"line-store": refs_of(bundle)})

"""Drills: a power cut, and a reboot onto a damaged ledger and a broken spec.

A power cut kills both processes at once, costs CRI-O its image store and empties ``/run``
(``DrillNode.power_cut``); the node then starts as systemd starts it (``DrillNode.boot``):
tmpfiles, ``nodeagent render-pins --write``, ``nodeagent run`` until READY=1, CRI-O.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.faults.conftest import NodeFactory
from tests.faults.consistency import assert_node_consistent, status_names
from tests.faults.node import DrillNode, pins_of
from tests.testenv.agent import set_state, set_status
from tests.testenv.faulty_proxy import is_blob

pytestmark = pytest.mark.drill


async def add_foreign_pin(node: DrillNode, ref: str) -> None:
    """Another component (the machine-config-daemon) pins ``ref`` in its own drop-in."""
    async with CriClient(node.crio.endpoint, timeout_s=60) as cri:
        await cri.pull_image(ref, None)
    (node.crio.dropin_dir / "50-pinned-images").write_text(
        f'[crio.image]\npinned_images = ["{ref}"]\n'
    )
    node.crio.reload()


def crio_started_with(node: DrillNode, refs: list[str]) -> bool:
    """Whether CRI-O's last start-up configuration dump lists every one of ``refs``."""
    dumps = node.crio.log_path.read_text().split("Current CRI-O configuration:")
    return len(dumps) > 1 and all(ref in dumps[-1].split("level=")[0] for ref in refs)


@pytest.mark.timeout(180)
async def test_power_cut_mid_pull_then_boot_in_unit_order_pins_everything_again(
    make_node: NodeFactory, drill_images: list[str]
) -> None:
    node = make_node(pull_settings="concurrency = 2")
    refs = [node.ref(r) for r in drill_images]
    keep, scratch, late, foreign = refs[:2], refs[2:3], refs[3:5], refs[5]
    await add_foreign_pin(node, foreign)
    node.agent.write_set("keep", keep)
    node.agent.write_set("scratch", scratch, is_persistent=False)
    node.agent.start()
    node.agent.wait_status(
        lambda s: set_state(s, "keep") == set_state(s, "scratch") == "Pinned",
        what="keep and scratch pinned",
    )
    node.proxy.throttle(4 << 20)
    before = node.proxy.body_bytes(is_blob)
    node.agent.write_set("late", late)
    node.proxy.wait_body_bytes(before + (3 << 20), match=is_blob)

    node.power_cut()
    node.proxy.throttle(None)
    mark = node.mark()
    fetched_before = node.proxy.body_bytes(is_blob)
    node.boot()

    assert crio_started_with(node, keep), "CRI-O did not start with the persistent pins"
    node.agent.wait_status(
        lambda s: (
            set_state(s, "keep") == set_state(s, "late") == "Pinned"
            and set_state(s, "scratch") is None
        ),
        what="keep and late pinned, the transient scratch gone",
    )
    await assert_node_consistent(node, sets={"keep": keep, "late": late}, since=mark)
    assert foreign in pins_of(node.link.read_text())
    assert node.proxy.body_bytes(is_blob) - fetched_before >= 4 * (8 << 20)  # pulled again
    pulled = re.findall(r"image_pulled: image=(\S+)", node.agent_log_since(mark))
    assert sorted(pulled) == sorted(keep + late)


@pytest.mark.timeout(180)
async def test_reboot_onto_a_damaged_ledger_and_a_broken_spec_keeps_the_boot_pins(
    make_node: NodeFactory, drill_images: list[str]
) -> None:
    node = make_node()
    refs = [node.ref(r) for r in drill_images]
    keep = refs[:2]
    spec = node.agent.write_set("keep", refs[:1])
    node.agent.start()
    node.agent.wait_status(lambda s: set_state(s, "keep") == "Pinned", what="keep pinned")
    node.agent.write_set("keep", keep)  # generation 2
    node.agent.wait_status(
        lambda s: (set_status(s, "keep") or {}).get("currentGeneration") == 2,
        what="keep pinned at generation 2",
    )
    node.agent.stop()
    node.crio.stop()

    node.power_cut(is_store_lost=False)
    (node.agent.state_dir / "ledger.json").write_bytes(b"\xff\xfe{not json")
    spec.write_text(spec.read_text().replace("pinnedImages:", "pinnedImages: [", 1))
    node.boot()

    assert crio_started_with(node, keep), "CRI-O did not start with the persistent pins"
    node.agent.wait_status(lambda s: status_names(node, "SpecInvalid"), what="SpecInvalid")
    async with CriClient(node.crio.endpoint, timeout_s=30) as cri:
        flags = [await cri.image_status(ref) for ref in keep]
    assert [image is not None and image.is_pinned for image in flags] == [True, True]
    item = set_status(node.agent.status() or {}, "keep")
    assert item is not None
    assert item["currentGeneration"] == 2
    assert "StateFileDamaged" in node.agent.current_run_log()


def _drop_image_records(storage_root: Path, refs: list[str]) -> None:
    """What CRI-O's storage repair does to an image it finds damaged: its record goes."""
    digests = {ref.split("@", 1)[1] for ref in refs}
    index = storage_root / "vfs-images" / "images.json"
    records = json.loads(index.read_bytes())
    kept = [r for r in records if not digests & set(r.get("digests") or [r.get("digest")])]
    assert len(kept) == len(records) - len(refs), "the images to drop were not all found"
    index.write_text(json.dumps(kept))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("is_wiped", [True, False], ids=["store-wiped", "one-image-repaired-away"])
async def test_images_lost_while_the_runtime_was_down_are_back_within_seconds_of_its_start(
    make_node: NodeFactory, drill_images: list[str], is_wiped: bool
) -> None:
    """The daemon stays up; CRI-O crashes and comes back without some or all pinned images.
    Nothing changes in the specs, so only the runtime's socket appearing tells the daemon
    to look (the periodic re-check is 10 minutes away)."""
    node = make_node()
    keep = [node.ref(r) for r in drill_images[:3]]
    node.agent.write_set("keep", keep)
    node.agent.start()
    node.agent.wait_status(lambda s: set_state(s, "keep") == "Pinned", what="keep pinned")
    node.crio.kill()
    if is_wiped:
        shutil.rmtree(node.crio.storage_root)
    else:
        _drop_image_records(node.crio.storage_root, keep[1:2])
    mark = node.mark()
    node.crio.start()
    started = time.monotonic()
    node.agent.wait_log("pinned_images_lost", timeout_s=20)
    async with CriClient(node.crio.endpoint, timeout_s=30) as cri:
        deadline = started + 30
        while True:
            found = [await cri.image_status(ref) for ref in keep]
            if all(image is not None and image.is_pinned for image in found):
                break
            assert time.monotonic() < deadline, f"not back and pinned: {keep}"
            await asyncio.sleep(0.2)
    back_s = time.monotonic() - started
    assert back_s < 20, f"{back_s:.1f} s after the runtime started"
    log = node.agent_log_since(mark)
    reason = "RuntimeStorageWiped" if is_wiped else "RuntimeImagesLost"
    assert f"pinned_images_lost: reason={reason}" in log
    assert "runtime_socket_appeared" in log
    status = node.agent.wait_status(
        lambda s: "imageLoss" in s and set_state(s, "keep") == "Pinned",
        what="keep pinned again, the loss in the status",
    )
    assert status["imageLoss"]["reason"] == reason
    assert status["imageLoss"]["imagesLost"] == (3 if is_wiped else 1)
    await assert_node_consistent(node, sets={"keep": keep}, since=mark)

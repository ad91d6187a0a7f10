"""Drills: the image filesystem fills up mid-pull (ENOSPC); admission without sizes.

CRI-O's store lives on a small loop-mounted ext4 (``make_disk``). In the ENOSPC drill
admission lets a set in, then another writer fills the filesystem while its layers are
crossing the proxy: the runtime's write fails with "no space left on device".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.conftest import DiskFactory, NodeFactory
from tests.faults.consistency import (
    assert_holding,
    assert_node_consistent,
    hold,
    hold_status_names,
    reasons_in,
    status_names,
    stored_images,
    wait_status_names,
)
from tests.faults.node import DrillNode
from tests.testenv.agent import set_state, set_status
from tests.testenv.faulty_proxy import Request, is_blob

pytestmark = pytest.mark.drill

MIB = 1 << 20


def fill(mountpoint: Path, *, leave_bytes: int) -> Path:
    """Another writer takes all but ``leave_bytes`` of the filesystem."""
    filler = mountpoint / "filler"
    free = os.statvfs(mountpoint)
    size = free.f_bavail * free.f_frsize - leave_bytes
    with filler.open("wb") as out:
        os.posix_fallocate(out.fileno(), 0, size)
    return filler


def pulls_in_crio_log(node: DrillNode, refs: list[str]) -> list[str]:
    log = node.crio.log_path.read_text()
    return [ref for ref in refs if f"Pulling image: {ref}" in log]


@pytest.mark.timeout(180)
async def test_disk_filled_mid_pull_is_named_and_the_next_sync_completes(
    make_disk: DiskFactory, make_node: NodeFactory, drill_images: list[str]
) -> None:
    disk = make_disk(96)
    node = make_node(storage_root=disk / "containers", pull_settings="concurrency = 2")
    refs = [node.ref(r) for r in drill_images]
    steady, growing = refs[:1], refs[1:3]
    node.agent.write_set("steady", steady)
    node.agent.start()
    node.agent.wait_status(lambda s: set_state(s, "steady") == "Pinned", what="steady pinned")
    mark = node.mark()

    node.proxy.throttle(2 * MIB)
    before = node.proxy.body_bytes(is_blob)
    node.agent.write_set("growing", growing)
    node.proxy.wait_body_bytes(before + 2 * MIB, match=is_blob)
    assert "disk_admitted" in node.agent_log_since(mark)
    filler = fill(disk, leave_bytes=MIB)
    node.proxy.throttle(None)

    wait_status_names(node, "NoSpaceLeft", timeout_s=60)
    status = node.agent.wait_status(
        lambda s: set_state(s, "growing") == "Degraded", what="growing degraded"
    )
    item = set_status(status, "growing")
    assert item is not None
    assert item["reason"] == "NoSpaceLeft"
    hold_status_names(node, "NoSpaceLeft", for_s=3)  # the disk stays full: so does the status
    await assert_holding(node, sets={"steady": steady})

    filler.unlink()  # the technician frees space; the next sync (here: a restart) resumes
    node.agent.stop()
    node.agent.start()
    node.agent.wait_status(
        lambda s: set_state(s, "steady") == set_state(s, "growing") == "Pinned",
        what="growing pinned once space is back",
    )
    await assert_node_consistent(node, sets={"steady": steady, "growing": growing}, since=mark)


def from_nodeagent(request: Request) -> bool:
    return request.is_from_nodeagent


@pytest.mark.drill_long
@pytest.mark.timeout(180)
async def test_sizes_unknown_hold_the_set_instead_of_filling_the_disk(
    make_disk: DiskFactory, make_node: NodeFactory, drill_images: list[str]
) -> None:
    disk = make_disk(64)
    node = make_node(storage_root=disk / "containers")
    refs = [node.ref(r) for r in drill_images[:5]]  # 44 MiB compressed, 88 MiB needed
    node.proxy.answer_errors(500, match=from_nodeagent)  # manifests: 500; CRI-O's pulls: fine
    node.agent.write_set("big", refs)
    node.agent.start()

    def nothing_pulled_nothing_full() -> bool:
        pulled = pulls_in_crio_log(node, refs)
        assert pulled == [], f"pulled with sizes unknown: {pulled}\n{node.agent.log_text()}"
        return "NoSpaceLeft" not in reasons_in(node.agent.status() or {})

    hold(nothing_pulled_nothing_full, for_s=15, what="sizes unknown: nothing pulled")
    assert status_names(node, "RegistryError"), "the held set does not name its cause"
    assert set_state(node.agent.status() or {}, "big") != "Pinned"

    node.proxy.heal()  # sizes can be learned again: the set does not fit, and says so
    status = node.agent.wait_status(
        lambda s: set_state(s, "big") == "Refused", what="big refused", timeout_s=60
    )
    item = set_status(status, "big")
    assert item is not None
    assert item["reason"] == "InsufficientDiskSpace"
    assert pulls_in_crio_log(node, refs) == []
    assert await stored_images(node) == []

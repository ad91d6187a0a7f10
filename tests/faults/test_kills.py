"""Drills: the daemon or CRI-O killed (SIGKILL) in the middle of a pull, CRI-O down a while.

Each drill pins a set first (``steady``: it must stay pinned through the fault), then
writes a second set (``growing``) whose pulls the proxy slows to 4 MiB/s, and strikes
once layer bytes of those pulls are crossing the proxy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.faults.conftest import NodeFactory
from tests.faults.consistency import (
    assert_holding,
    assert_node_consistent,
    hold_status_names,
    stored_images,
    wait_status_names,
)
from tests.faults.node import DrillNode
from tests.testenv.agent import set_state
from tests.testenv.faulty_proxy import is_blob

pytestmark = pytest.mark.drill

SLOW_BYTES_PER_S = 4 << 20


def pinned(node: DrillNode, *names: str) -> None:
    node.agent.wait_status(
        lambda s: all(set_state(s, name) == "Pinned" for name in names),
        what=f"{', '.join(names)} pinned",
    )


def start_slow_pull(node: DrillNode, steady: list[str], growing: list[str]) -> None:
    """``steady`` pinned, then ``growing`` written and its layers crossing the slow proxy."""
    node.agent.write_set("steady", steady)
    node.agent.start()
    pinned(node, "steady")
    node.proxy.throttle(SLOW_BYTES_PER_S)
    before = node.proxy.body_bytes(is_blob)
    node.agent.write_set("growing", growing)
    node.proxy.wait_body_bytes(before + (3 << 20), match=is_blob)


async def assert_struck_mid_pull(node: DrillNode, steady: list[str], growing: list[str]) -> None:
    """Right after the strike: ``growing`` is incomplete, and the node holds ``steady``.
    With CRI-O dead, what its storage committed is read from its own image list on disk
    (containers-storage's ``vfs-images/images.json``): the check ran only while CRI-O lived
    before, so the CRI-O drills never made it."""
    if node.crio.process is not None:
        names = {name for image in await stored_images(node) for name in image.names()}
        assert not set(growing) <= names, "the fault came after the pulls had finished"
    else:
        digests = committed_digests(node.crio.storage_root)
        wanted = {ref.partition("@")[2] for ref in growing}
        assert not wanted <= digests, "the fault came after the pulls had finished"
        assert {ref.partition("@")[2] for ref in steady} <= digests
        return
    await assert_holding(node, sets={"steady": steady})


def committed_digests(storage_root: Path) -> set[str]:
    """The manifest digests of the images containers-storage committed (vfs driver)."""
    listing = storage_root / "vfs-images" / "images.json"
    if not listing.exists():
        return set()
    images = json.loads(listing.read_text())
    return {d for image in images for d in [image.get("digest"), *image.get("digests", [])] if d}


@pytest.mark.timeout(150)
async def test_daemon_killed_mid_pull_resumes_without_pulling_twice(
    make_node: NodeFactory, drill_images: list[str]
) -> None:
    node = make_node(pull_settings="concurrency = 2")
    refs = [node.ref(r) for r in drill_images]
    steady, growing = refs[:2], refs[2:]
    mark = node.mark()
    start_slow_pull(node, steady, growing)

    node.agent.kill()  # SIGKILL: no cleanup; CRI-O cancels the pulls of the dead client
    await assert_struck_mid_pull(node, steady, growing)

    node.proxy.throttle(None)
    node.agent.start()
    pinned(node, "steady", "growing")
    await assert_node_consistent(node, sets={"steady": steady, "growing": growing}, since=mark)


@pytest.mark.timeout(150)
async def test_crio_killed_mid_pull_and_restarted_recovers(
    make_node: NodeFactory, drill_images: list[str]
) -> None:
    node = make_node(pull_settings="concurrency = 2")
    refs = [node.ref(r) for r in drill_images]
    steady, growing = refs[:2], refs[2:]
    mark = node.mark()
    start_slow_pull(node, steady, growing)

    node.crio.kill()  # SIGKILL: CRI-O's pulls die with it, its socket stops answering
    await assert_struck_mid_pull(node, steady, growing)
    node.proxy.throttle(None)
    node.crio.start()  # as systemd's Restart= would

    pinned(node, "steady", "growing")
    await assert_node_consistent(node, sets={"steady": steady, "growing": growing}, since=mark)
    assert "reason=RuntimeUnreachable" in node.agent.log_text()


@pytest.mark.drill_long
@pytest.mark.timeout(180)
async def test_crio_down_mid_pull_is_named_in_the_status_while_it_lasts(
    make_node: NodeFactory, drill_images: list[str]
) -> None:
    node = make_node(pull_settings="concurrency = 2")
    refs = [node.ref(r) for r in drill_images]
    steady, growing = refs[:2], refs[2:]
    mark = node.mark()
    start_slow_pull(node, steady, growing)

    node.crio.stop()  # systemctl stop crio: down for 15 s
    down_at = time.monotonic()
    wait_status_names(node, "RuntimeUnreachable", timeout_s=5)
    hold_status_names(node, "RuntimeUnreachable", for_s=15 - (time.monotonic() - down_at))
    await assert_struck_mid_pull(node, steady, growing)
    node.proxy.throttle(None)
    node.crio.start()

    node.agent.wait_status(
        lambda s: set_state(s, "growing") == "Pinned", what="growing pinned", timeout_s=60
    )
    await assert_node_consistent(node, sets={"steady": steady, "growing": growing}, since=mark)

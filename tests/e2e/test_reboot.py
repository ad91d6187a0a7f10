"""Reboots of the node: pins are in CRI-O's configuration before CRI-O serves anything, and
the pin link never dangles, even when nodeagent does not run at boot."""

from __future__ import annotations

import re

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.conftest import Pushed
from tests.testenv.agent import set_state
from tests.testenv.node import Node

SET = "e2e-reboot"
LINK = "/etc/crio/crio.conf.d/99-nodeagent-pinned-images.conf"
TARGET = "/run/crio/crio.conf.d/99-nodeagent-pinned-images.conf"


@pytest.fixture(scope="module")
def refs(node: Node, pushed: Pushed) -> list[str]:
    refs = [pushed.ref(pushed.base_a)]
    node.write_set(SET, refs)
    node.wait_status(lambda s: set_state(s, SET) == "Pinned", what=f"{SET} pinned")
    return refs


def crio_start_config(node: Node) -> str:
    """The configuration CRI-O logged when it started in this boot, before it listened."""
    lines = node.journal("-b", "-u", "crio", "-o", "cat").splitlines()
    starts = [line for line in lines if "Current CRI-O configuration" in line]
    assert starts, "CRI-O did not log its configuration in this boot"
    return starts[0]


def start_pins(node: Node) -> list[str]:
    found = re.search(r"pinned_images = \[(.*?)\]", crio_start_config(node).replace('\\"', '"'))
    assert found is not None
    return re.findall(r'"([^"]+)"', found.group(1))


async def test_persistent_pins_are_back_before_crio_answers_after_reboot(
    node: Node, refs: list[str]
) -> None:
    boot_before = node.container.boots
    node.container.reboot()
    assert node.container.boots == boot_before + 1
    node.wait_active("crio.service", "nodeagent.service")
    # CRI-O dumps the configuration it loaded before it opens its socket: the pins were in
    # the files at start (rendered by nodeagent's ExecStartPre from its ledger), not put
    # there by a reload afterwards.
    assert set(refs) <= set(start_pins(node))
    crio_lines = node.journal("-b", "-u", "crio", "-o", "cat")
    assert f"Updating config from drop-in file: {LINK}" in crio_lines
    target = node.container.live(TARGET).read_text()
    assert all(ref in target for ref in refs)
    async with CriClient(node.cri_endpoint) as cri:
        images = [await cri.image_status(ref) for ref in refs]
    assert all(image is not None and image.is_pinned for image in images)


async def test_pin_link_never_dangles_when_nodeagent_does_not_run_at_boot(
    node: Node, refs: list[str]
) -> None:
    """The tmpfiles.d entry creates the link's target in the fresh /run: CRI-O starts."""
    node.container.systemctl("disable", "nodeagent.service")
    try:
        node.container.reboot()
        node.wait_active("crio.service")
        assert node.show("nodeagent.service", "ActiveState")["ActiveState"] == "inactive"
        assert node.container.live(TARGET).read_text() == ""  # valid, empty drop-in
        assert (node.root / LINK.lstrip("/")).is_symlink()
        assert start_pins(node) == []
    finally:
        node.container.systemctl("enable", "--now", "nodeagent.service")
    node.wait_active("nodeagent.service")
    node.wait_event("sync_finished")
    async with CriClient(node.cri_endpoint) as cri:
        images = [await cri.image_status(ref) for ref in refs]
    assert all(image is not None and image.is_pinned for image in images)

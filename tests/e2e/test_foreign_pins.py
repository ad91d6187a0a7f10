"""The path unit under a booted systemd: another component's pin reaches CRI-O while
nodeagent.service is stopped (decision 0044).

The package's ``nodeagent-foreign-pins.path`` (enabled by its preset) watches CRI-O's drop-in
directories. With nodeagent stopped, a component writes its own drop-in with a pin and
reloads CRI-O, as the machine-config-daemon does: nodeagent's file, read last, would
override it; the path unit's service re-renders and reloads, and the image reports pinned.
This node boots without the host's udev (no media here).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.conftest import Pushed
from tests.e2e.conftest import booted_node
from tests.testenv.agent import set_state
from tests.testenv.node import Node
from tests.testenv.registry import Registry
from tests.testenv.waiting import wait_for

SET = "e2e-foreign"
FOREIGN = "etc/crio/crio.conf.d/50-pinned-images"


@pytest.fixture(scope="module")
def plain_node(
    tmp_path_factory: pytest.TempPathFactory, rpms: list[Path], registry: Registry
) -> Iterator[Node]:
    with booted_node(tmp_path_factory.mktemp("foreign"), rpms, registry) as node:
        yield node


async def pinned(node: Node, ref: str) -> bool | None:
    async with CriClient(node.cri_endpoint) as cri:
        image = await cri.image_status(ref)
    return None if image is None else image.is_pinned


@pytest.mark.timeout(300)
async def test_a_pin_added_while_nodeagent_is_stopped_reaches_crio(
    plain_node: Node, pushed: Pushed
) -> None:
    node = plain_node
    mine, theirs = pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)
    assert node.is_active("nodeagent-foreign-pins.path"), node.unit_status(
        "nodeagent-foreign-pins.path"
    )
    node.write_set(SET, [mine])
    node.wait_status(lambda s: set_state(s, SET) == "Pinned", what=f"{SET} pinned")
    async with CriClient(node.cri_endpoint) as cri:
        await cri.pull_image(theirs)
    node.container.systemctl("stop", "nodeagent.service")
    runs_before = node.journal("-u", "nodeagent-foreign-pins.service", "-o", "cat").count("wrote:")

    started = time.monotonic()
    (node.root / FOREIGN).write_text(f'[crio.image]\npinned_images = ["{theirs}"]\n')
    node.container.systemctl("reload", "crio.service")

    deadline = time.monotonic() + 30
    while await pinned(node, theirs) is not True:  # CRI polled every 0.2 s, for 30 s at most
        assert time.monotonic() < deadline, node.journal("-u", "nodeagent-foreign-pins")[-4000:]
        await asyncio.sleep(0.2)
    carried_s = time.monotonic() - started
    print(f"carried by the path unit in {carried_s:.2f} s")
    assert await pinned(node, mine) is True
    journal = node.journal("-u", "nodeagent-foreign-pins.service", "-o", "cat")
    assert journal.count("wrote:") > runs_before
    assert "reloaded crio.service (dbus)" in journal
    wait_for(
        lambda: not node.is_active("nodeagent-foreign-pins.service"),
        timeout_s=30, what="the path unit's service done",
    )  # fmt: skip
    assert node.is_active("nodeagent-foreign-pins.path")
    node.container.systemctl("start", "nodeagent.service")
    node.wait_active("nodeagent.service")

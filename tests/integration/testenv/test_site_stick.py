"""The site's stick: a loop device only node 0 sees, by udev event and by enumeration.

One kernel serves every node namespace, so "plugged into node 0" is made of two parts
(``tests/testenv/site_node.py``): the test udevd runs in node 0's network namespace, so
its events reach node 0's daemon alone, and the other nodes' daemons run over an empty
udev database of their own, so enumerating at start finds nothing either.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.testenv.agent import set_state
from tests.testenv.bundles import build_factory, ext4_media
from tests.testenv.node_udevd import NodeUdevd
from tests.testenv.site_net import SiteNetUnavailable, SiteNetwork
from tests.testenv.site_node import SiteNode
from tests.testenv.site_pki import make_ca
from tests.testenv.site_stick import stick_site_udevd
from tests.testenv.udev import LoopMedia

pytestmark = pytest.mark.integration

LABEL = "NODEAGENT1"
ENUMERATE = f"""
import json, pyudev
found = pyudev.Context().list_devices(subsystem="block", ID_FS_LABEL="{LABEL}")
print(json.dumps(sorted(d.device_node for d in found)))
"""


@contextmanager
def two_nodes(tmp_path: Path) -> Iterator[tuple[SiteNetwork, NodeUdevd]]:
    with ExitStack() as stack:
        try:
            site = stack.enter_context(stick_site_udevd(tmp_path, 2))
        except SiteNetUnavailable as exc:
            pytest.skip(str(exc))
        yield site


def labelled_devices(node: SiteNode) -> list[str]:
    cmd = [*node.exec_prefix, node.python, "-c", ENUMERATE]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True)
    return list(json.loads(done.stdout))


@pytest.mark.timeout(120)
def test_the_stick_is_seen_by_node_0_alone(tmp_path: Path) -> None:
    ca = make_ca("site CA")
    with two_nodes(tmp_path) as (net, udevd):
        nodes = [
            SiteNode(
                tmp_path / f"node-{h.index}",
                h,
                name=f"node-{h.index}",
                ca=ca,
                serve=False,
                watch_media=True,
                has_stick=h.index == 0,
            )
            for h in net.hosts
        ]
        files = {"bundle.json": (b"{}", 0o644)}
        with LoopMedia.create(tmp_path / "media", "ext4", label=LABEL, files=files) as media:
            try:
                for node in nodes:
                    node.start(ready="media_watch_started")
                devnode = media.attach()
                nodes[0].wait_log("media_arrived")
                udevd.settle()  # udevd has sent every event about the device by now
                assert "media_arrived" not in nodes[1].current_run_log()
                assert [labelled_devices(n) for n in nodes] == [[devnode], []]
            finally:
                for node in nodes:
                    node.close()


def bundle_states(status: dict[str, Any] | None) -> list[str]:
    return [str(b["state"]) for b in (status or {}).get("bundles", [])]


@pytest.mark.timeout(240)
def test_node_0_imports_and_pins_a_signed_bundle_from_its_stick(tmp_path: Path) -> None:
    """The full path the site tests start from: in its namespace, node 0 mounts the stick,
    serves the bundle on its own loopback, and its own CRI-O pulls and pins it."""
    factory = build_factory(tmp_path / "factory", count=2, layer_bytes=1 << 20, seed=15)
    ca = make_ca("site CA")
    with two_nodes(tmp_path) as (net, udevd):
        nodes = [
            SiteNode(
                tmp_path / f"node-{h.index}",
                h,
                name=f"node-{h.index}",
                ca=ca,
                serve=False,
                watch_media=True,
                has_stick=h.index == 0,
                with_crio=h.index == 0,
                trusted_keys=[factory.public_key],
            )
            for h in net.hosts
        ]
        with ext4_media(tmp_path, factory.bundle) as media:
            try:
                for node in nodes:
                    node.start(ready="media_watch_started")
                media.attach()
                status = nodes[0].wait_status(
                    lambda s: (
                        bundle_states(s) == ["pinned"]
                        and set_state(s, factory.set_name) == "Pinned"
                    ),
                    what="the stick's bundle imported and its set pinned",
                    timeout_s=180,
                )
                assert status["bundles"][-1]["images"] == {"total": 2, "present": 2}
                udevd.settle()
                assert bundle_states(nodes[1].status()) == []
                assert "bundle_media_detected" not in nodes[1].current_run_log()
            finally:
                for node in nodes:
                    node.close()

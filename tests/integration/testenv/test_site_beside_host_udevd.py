"""The site's stick beside a host's own udev daemon, as on every systemd-booted machine.

A systemd host runs systemd-udevd in its own namespaces, owning ``/run/udev``. The site tests
give the stick to one node with a udevd of that node's (``tests/testenv/node_udevd.py``),
over a ``/run/udev`` of its own, so both daemons run side by side; the e2e suite gives the
host's daemon the packaged rule for the run (``host_rules``). This machine runs no udevd,
so the module starts a stand-in for the host's (``HostUdevd``: one in the host's
namespaces over ``/run/udev``, which the tests do not count as theirs). ``make
beside-udevd`` runs every site and stick test the same way (``tests/testenv/beside_udevd.py``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.integration.testenv.test_site_stick import LABEL, labelled_devices
from tests.testenv.node_udevd import HostUdevd, host_rules
from tests.testenv.site_net import SiteNetUnavailable
from tests.testenv.site_node import SiteNode
from tests.testenv.site_pki import make_ca
from tests.testenv.site_stick import stick_site_udevd
from tests.testenv.udev import (
    LoopMedia,
    foreign_udevd_answers,
    settle,
    udev_properties,
    udevd_answers,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def host_udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A udevd in the host's namespaces owning ``/run/udev``: this machine's own when one
    runs, else the stand-in, which the tests' ``Udevd`` takes for a host's."""
    if udevd_answers():
        yield
        return
    with HostUdevd(tmp_path_factory.mktemp("host-udevd")):
        assert foreign_udevd_answers()
        yield


@pytest.mark.timeout(120)
def test_the_stick_is_node_0_s_alone_beside_the_host_udevd(
    host_udevd: None, tmp_path: Path
) -> None:
    ca = make_ca("site CA")
    with ExitStack() as stack:
        try:
            net, udevd = stack.enter_context(stick_site_udevd(tmp_path, 2))
        except SiteNetUnavailable as exc:
            pytest.skip(str(exc))
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
        media = stack.enter_context(
            LoopMedia.create(tmp_path / "media", "ext4", label=LABEL, files=files)
        )
        for node in nodes:
            stack.callback(node.close)
            node.start(ready="media_watch_started")
        devnode = media.attach()
        nodes[0].wait_log("media_arrived")
        udevd.settle()
        settle()
        assert "media_arrived" not in nodes[1].current_run_log()
        assert [labelled_devices(n) for n in nodes] == [[devnode], []]
        # Both daemons processed the kernel's event, each into its own database.
        assert udevd.properties(devnode).get("ID_FS_LABEL") == LABEL
        assert udev_properties(devnode).get("ID_FS_LABEL") == LABEL
    assert udevd_answers(), "the host's udevd outlived the node's"


def test_a_rule_given_to_the_host_udevd_marks_media_for_the_run_only(
    host_udevd: None, tmp_path: Path
) -> None:
    """What the e2e suite does on a systemd host with the packaged rule (tests/e2e/conftest.py):
    a rule installed in the running daemon's ``/run/udev/rules.d`` applies to the next event,
    and is gone, file and effect, after the run."""
    token = secrets.token_hex(8)
    rules = tmp_path / "89-nodeagent-beside-test.rules"
    rules.write_text(
        f'SUBSYSTEM=="block", ENV{{ID_FS_LABEL}}=="{LABEL}", ENV{{NODEAGENT_TEST_RULE}}="{token}"\n'
    )
    with LoopMedia.create(tmp_path / "media", "ext4", label=LABEL) as media:
        devnode = media.attach()
        with host_rules(rules) as installed:
            assert installed.read_text() == rules.read_text()
            media.trigger_add()
            settle()
            assert udev_properties(devnode).get("NODEAGENT_TEST_RULE") == token
        assert not installed.exists()
        media.trigger_add()
        settle()
        assert "NODEAGENT_TEST_RULE" not in udev_properties(devnode)

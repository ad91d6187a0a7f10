"""An import's loopback mirror under a real systemd runs as ``nodeagent-session@.service``:
the RPM's socket unit, the ``nodeagent-peer`` user, no capability (decision 0064).

``nodeagent bundle import`` (root, in the booted node) asks ``nodeagent-session.socket``
for its server; the journal's ``_UID``, ``_PID`` and ``_CAP_EFFECTIVE`` of that server's
entries are the kernel's word, not the process's. No udev: the bundle is a directory in
the node (tests/e2e/test_media.py takes the stick path).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from nodeagent.adapters.cri.client import CriClient
from tests.testenv.agent import set_state
from tests.testenv.bundles import Factory, build_factory
from tests.testenv.node import Node


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    # its own bundle id and set: the shared e2e node holds another factory's "line-3-test"
    return build_factory(
        tmp_path_factory.mktemp("factory"), count=2, layer_bytes=1 << 20, seed=83,
        bundle_id="session-e2e", set_name="session-e2e",
    )  # fmt: skip


@pytest.mark.timeout(300)
async def test_a_bundle_import_is_served_by_the_unprivileged_session_unit(
    node: Node, factory: Factory
) -> None:
    assert node.show("nodeagent-session.socket", "ActiveState")["ActiveState"] == "active"
    assert node.container.run("stat", "-c", "%a %U", "/run/nodeagent/session.sock").stdout == (
        "600 root\n"
    )
    (node.root / "etc/nodeagent/trusted-keys.d/session.pub").write_text(factory.public_key)
    bundle = node.root / "root" / "session-bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.copytree(factory.bundle, bundle)
    # a by-hand import takes the daemon's pin lock (DaemonRunning beside it): stopped first
    node.container.systemctl("stop", "nodeagent.service")
    imported = node.container.run(
        "nodeagent", "bundle", "import", "/root/session-bundle", "--json",
        check=False, timeout_s=150,
    )  # fmt: skip
    node.container.systemctl("start", "nodeagent.service")
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert json.loads(imported.stdout[imported.stdout.index("{") :])["state"] == "imported"

    peer_uid = node.container.run("id", "-u", "nodeagent-peer").stdout.strip()
    started = re.findall(r"session_server_started: .* pid=(\d+) uid=(\d+)", imported.stderr)
    assert started and {uid for _pid, uid in started} == {peer_uid} != {"0"}, imported.stderr
    served = node.journal_entries(
        "-u", "nodeagent-session@*", "NODEAGENT_EVENT=bundle_server_started"
    )
    mine = [e for e in served if e["_PID"] in {pid for pid, _uid in started}]
    assert mine, node.journal("-u", "nodeagent-session@*")
    assert {e["_UID"] for e in mine} == {peer_uid}
    assert all(e["_SYSTEMD_UNIT"].startswith("nodeagent-session@") for e in mine)
    assert all(int(e.get("_CAP_EFFECTIVE", "0"), 16) == 0 for e in mine)
    ended = node.journal_entries(
        "-u", "nodeagent-session@*", "NODEAGENT_EVENT=bundle_server_stopped"
    )
    assert {e["_PID"] for e in ended} >= {e["_PID"] for e in mine}  # ended with the import

    # The daemon itself, under its hardened unit: an image gone from CRI-O comes back from
    # the store through a session of its own, served by the unit too.
    node.wait_status(lambda s: set_state(s, factory.set_name) == "Pinned", what="set pinned")
    node.container.systemctl("stop", "nodeagent.service")
    async with CriClient(node.cri_endpoint) as cri:
        await cri.remove_image(factory.refs[0])
    node.container.systemctl("start", "nodeagent.service")
    node.wait_event("images_restored_from_store")
    daemon = node.show("nodeagent.service", "MainPID")["MainPID"]
    said = node.journal_entries("-u", "nodeagent", "NODEAGENT_EVENT=session_server_started")
    pattern = re.compile(rf" pid=(\d+) uid={peer_uid}\b")
    pids = {m.group(1) for e in said if (m := pattern.search(e["MESSAGE"]))}
    served = node.journal_entries(
        "-u", "nodeagent-session@*", "NODEAGENT_EVENT=bundle_server_started"
    )
    before = {e["_PID"] for e in mine}
    restored = [e for e in served if e["_PID"] in pids - before]
    assert restored and {e["_UID"] for e in restored} == {peer_uid}, said
    assert daemon not in {e["_PID"] for e in restored}

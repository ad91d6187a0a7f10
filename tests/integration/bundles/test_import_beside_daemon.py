"""``bundle import`` by hand takes the daemon's pin lock (decision 0044): beside a running
daemon it ran a full sync of its own and raced the daemon for the node's pins (issue 28).
Now it is refused with ``DaemonRunning`` (exit 75) and the daemon's pins stay as they were;
with the daemon stopped it imports.

Real parts: the daemon (``nodeagent run``), CRI-O, a signed bundle."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.testenv.agent import Agent
from tests.testenv.crio import Crio
from tests.testenv.images import default_cache_dir
from tests.testenv.signed_bundles import Keys, image, signed_bundle
from tests.testenv.waiting import wait_for

pytestmark = pytest.mark.integration

MIB = 1 << 20


def test_a_by_hand_import_beside_the_running_daemon_is_refused_then_works_alone(
    tmp_path: Path, fresh_crio: Crio
) -> None:
    keys = Keys.make(tmp_path / "keys")
    images = [image("beside/daemon", [(MIB, 1801)], default_cache_dir())]
    bundle = signed_bundle(tmp_path / "bundle", keys, images, bundle_id="beside", set_name="beside")
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.trusted_keys_dir.mkdir(parents=True, exist_ok=True)
    (agent.trusted_keys_dir / "factory.pub").write_text(
        (keys.trusted_dir / "factory.pub").read_text()
    )
    with agent:
        assert agent.process is not None
        lock = agent.run_dir / "pins.lock"  # the daemon takes it first thing, holds it for life
        pid = str(agent.process.pid)
        wait_for(
            lambda: lock.exists() and lock.read_text().strip() == pid,
            timeout_s=30, what="the daemon holding the pin lock",
        )  # fmt: skip
        done = agent.cli("bundle", "import", str(bundle.root))
        assert done.returncode == 75, done.stdout + done.stderr
        assert "error: DaemonRunning: the nodeagent daemon (process " in done.stderr
        assert "stop the daemon first (systemctl stop nodeagent)" in done.stderr
        assert "bundle_imported" not in done.stdout + done.stderr
    done = agent.cli("bundle", "import", str(bundle.root))
    assert done.returncode == 0, done.stdout + done.stderr

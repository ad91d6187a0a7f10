"""Another component's pins reach CRI-O while nodeagent is stopped (decision 0044).

nodeagent's drop-in sorts last and restates every other file's ``pinned_images``; CRI-O
keeps the last file's list only. With the daemon stopped, a pin another component adds
(here as the machine-config-daemon does: its own drop-in, then a reload) is overridden by
nodeagent's stale copy until ``nodeagent render-pins --write --reload`` runs: the command
of ``systemd/nodeagent-foreign-pins.service``, which ``nodeagent-foreign-pins.path`` starts
when a file in CRI-O's drop-in directories changes. No systemd here, so the test runs the
command exactly as the unit does, against the real CRI-O of tests/testenv.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from nodeagent.adapters.cri.client import CriClient
from tests.conftest import Pushed
from tests.integration.pins.test_flow import _wait_flag, pinned_flags
from tests.testenv.agent import Agent, set_state
from tests.testenv.crio import Crio

REPO = Path(__file__).resolve().parents[3]
RELOADED = "Configuration reload completed"


def unit_command() -> list[str]:
    """The path unit's service's command, without the launcher's path."""
    unit = (REPO / "systemd" / "nodeagent-foreign-pins.service").read_text()
    found = re.search(r"^ExecStart=/usr/bin/nodeagent (.+)$", unit, re.MULTILINE)
    assert found is not None
    return found.group(1).split()


async def test_a_pin_added_while_stopped_is_carried_within_seconds(
    fresh_crio: Crio, pushed: Pushed, tmp_path: Path
) -> None:
    mine, theirs = pushed.ref(pushed.base_a), pushed.ref(pushed.base_b)
    agent = Agent(tmp_path / "agent", fresh_crio)
    agent.write_config()
    agent.write_set("mine", [mine])
    with agent:
        agent.wait_status(lambda s: set_state(s, "mine") == "Pinned", what="mine pinned")
        # While the daemon runs it holds the lock: the unit's command leaves the file alone.
        held = agent.cli(*unit_command())
        assert held.returncode == 0, held.stderr
        pid = agent.process.pid if agent.process is not None else -1
        assert held.stdout.startswith(f"skipped: process {pid} holds"), held.stdout
    async with CriClient(fresh_crio.endpoint) as cri:
        await cri.pull_image(theirs)

    # Daemon stopped. Another component pins its image and reloads CRI-O: nodeagent's file,
    # read last, still carries the old list, so the new pin is lost.
    other = fresh_crio.dropin_dir / "50-pinned-images"
    other.write_text(f'[crio.image]\npinned_images = ["{theirs}"]\n')
    fresh_crio.reload()
    assert await pinned_flags(fresh_crio, [mine, theirs]) == {mine: True, theirs: False}

    started = time.monotonic()
    result = agent.cli(*unit_command())
    assert result.returncode == 0, result.stderr
    assert "wrote:" in result.stdout and "reloaded" in result.stdout, result.stdout
    assert await _wait_flag(fresh_crio, theirs, expected=True, timeout_s=10)
    carried_s = time.monotonic() - started
    assert carried_s < 10
    assert (await pinned_flags(fresh_crio, [mine]))[mine] is True
    print(f"carried the new pin in {carried_s:.2f} s")

    # The path unit fires again (on that very write): same bytes, no write, no reload.
    reloads = fresh_crio.log_path.read_text(errors="replace").count(RELOADED)
    again = agent.cli(*unit_command())
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("unchanged:") and "reloaded" not in again.stdout
    assert fresh_crio.log_path.read_text(errors="replace").count(RELOADED) == reloads

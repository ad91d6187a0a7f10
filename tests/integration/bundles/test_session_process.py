"""An import's loopback mirror runs in a process of its own, never in the daemon (decision 0064).

Real parts: systemd-udevd with a loop device, CRI-O, the daemon, and the session process
it starts (``[bundles] session_socket = ""``, the test harness's way; the e2e node under
systemd checks the unprivileged one, tests/e2e/test_session_unit.py). The registry is
stopped. While a session runs, the daemon holds no listening TCP socket (its descriptors
against /proc/net/tcp and tcp6); the session process is the one listening. Killed in the
middle of the import, the import stops at once with ``BundleServerLost`` and the mirror
drop-in is removed; the daemon started again imports the stick and pins everything,
and never mapped aiohttp.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.bundles.test_importer import agent_for, bundle_state, last_bundle, pinned
from tests.testenv.agent import set_state
from tests.testenv.bundles import Factory, build_factory, ext4_media
from tests.testenv.crio import Crio
from tests.testenv.udev import LoopMedia, Udevd, free_loop_device
from tests.testenv.waiting import wait_for

LISTEN = "0A"
"""The TCP state of a listening socket in /proc/net/tcp."""


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Factory:
    return build_factory(tmp_path_factory.mktemp("factory"), count=3, layer_bytes=2 << 20, seed=64)


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


def listening_inodes() -> set[str]:
    """Inodes of every listening TCP socket in this network namespace (the daemon's)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == LISTEN:
                found.add(fields[9])
    return found


def socket_inodes(pid: int) -> set[str]:
    found: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:  # closed meanwhile
            continue
        if match := re.fullmatch(r"socket:\[(\d+)\]", target):
            found.add(match.group(1))
    return found


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {name} for {pid}")


def session_children(daemon: int) -> list[int]:
    """The daemon's children running ``nodeagent serve-session``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == daemon and b"serve-session" in argv:
            found.append(int(entry.name))
    return found


def aiohttp_mapped(pid: int) -> bool:
    return "aiohttp" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.timeout(150)
async def test_the_session_runs_apart_a_killed_one_stops_the_import_and_a_replug_finishes_it(
    udevd: Udevd, factory: Factory, fresh_crio: Crio, tmp_path: Path
) -> None:
    media: LoopMedia = ext4_media(tmp_path, factory.bundle)
    agent = agent_for(tmp_path, fresh_crio, factory.public_key)
    dropin = fresh_crio.registries_dir / "99-nodeagent-bundle-mirror.conf"
    try:
        with agent:
            agent.wait_log("daemon_started")
            assert agent.process is not None
            daemon = agent.process.pid
            media.attach(free_loop_device())
            # Caught as it starts (an interpreter takes ~0.4 s), held once it listens.
            pid = wait_for(lambda: session_children(daemon), timeout_s=60, interval_s=0.005,
                           what="the session process")[0]  # fmt: skip
            wait_for(lambda: socket_inodes(pid) & listening_inodes(), timeout_s=20,
                     interval_s=0.005, what="the session process listening")  # fmt: skip
            os.kill(pid, signal.SIGSTOP)
            agent.wait_status(lambda s: bundle_state(s) == "importing", what="importing")
            assert not socket_inodes(daemon) & listening_inodes()
            assert status_field(pid, "Uid").split()[:2] == [str(os.getuid())] * 2
            assert status_field(pid, "NoNewPrivs") == "1"
            assert int(status_field(pid, "CapEff"), 16) == 0  # a root daemon's child too

            os.kill(pid, signal.SIGKILL)
            status = agent.wait_status(
                lambda s: bundle_state(s) == "rejected", what="the import stopped"
            )
            assert last_bundle(status)["reason"] == "BundleServerLost"
            assert not dropin.exists()
            assert "session_server_lost" in agent.current_run_log()

        with agent:  # the daemon started again finds the stick and imports it again
            assert agent.process is not None
            daemon = agent.process.pid
            agent.wait_status(
                lambda s: (
                    bundle_state(s) == "pinned" and set_state(s, factory.set_name) == "Pinned"
                ),
                what="imported again and pinned",
            )
            assert "session_server_stopped" in agent.current_run_log()
            assert not aiohttp_mapped(daemon)
    finally:
        media.detach()
    assert await pinned(fresh_crio, factory.refs) == factory.refs

"""What Debian's podman and conmon forward of a container's sd_notify messages with
``--sdnotify=container``, the container unit's Type=notify (systemd/container/): READY=1
and WATCHDOG=1 reach the manager's socket (and MAINPID, conmon's), STATUS= does not (conmon
forwards it from 2.1.9 on; Debian 12 has 2.1.6: docs/runtime-facts.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.testenv.agent_image import notify_layout
from tests.testenv.packages import ensure_packages


def conmon_version() -> str:
    out = subprocess.run(["conmon", "--version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[2]


@pytest.mark.timeout(120)
def test_ready_and_watchdog_are_forwarded_status_is_not_before_conmon_2_1_9(
    tmp_path: Path,
) -> None:
    ensure_packages({"podman": "/usr/bin/podman", "runc": "/usr/bin/runc"})
    layout = notify_layout(tmp_path / "image")
    received: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="na-run.") as runroot,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager,
    ):
        manager.bind(str(tmp_path / "notify.sock"))
        manager.settimeout(0.5)
        cmd = ["podman", "--root", str(tmp_path / "storage"), "--runroot", runroot]
        # runc: this machine's cgroups are hybrid, which crun refuses.
        cmd += ["--storage-driver", "vfs", "--runtime", "/usr/bin/runc"]
        cmd += ["run", "--rm", "--sdnotify=container", "--network=host"]
        cmd += ["--ulimit", "nofile=2048:2048", "--ulimit", "nproc=4096:4096"]
        cmd += [f"oci:{layout}:localhost/nodeagent:notify"]
        cmd += ["READY=1", "WATCHDOG=1", "STATUS=started", "WATCHDOG=1"]
        env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify.sock"))
        process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while process.poll() is None and time.monotonic() < deadline:
            try:
                received.append(manager.recv(4096).decode())
            except TimeoutError:
                continue
        output = process.communicate(timeout=30)[0].decode(errors="replace")
    assert process.returncode == 0, output
    assert "READY=1" in received, received
    assert received.count("WATCHDOG=1") == 2, received
    assert any(m.startswith("MAINPID=") for m in received), received
    if tuple(int(x) for x in conmon_version().split(".")) < (2, 1, 9):
        assert not any("STATUS=" in m for m in received), received

"""The systemd adapter against real peers: a private dbus-daemon, real processes, real sockets.

The private bus has no systemd on it, so these tests cover the SIGHUP fallback,
its refusals and sd_notify. The D-Bus job path needs systemd itself: it is
covered in tests/service/ against a stand-in until the nspawn system test runs
it against a real systemd.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.systemd import Notifier, RuntimeReloader
from nodeagent.errors import ConfigInvalid, RuntimeReloadFailed
from tests.testenv.dbus import HupChild

# ---------------------------------------------------------------- fallback: SIGHUP


async def test_bus_without_systemd_falls_back_to_sighup(
    bus_address: str, hup_child: HupChild
) -> None:
    reloader = RuntimeReloader("crio.service", pid_file=hup_child.pid_file, bus_address=bus_address)
    assert await reloader.reload() == "sighup"
    assert await hup_child.exit_code() == 0
    assert hup_child.marker.read_text() == "reloaded"


async def test_unreachable_bus_falls_back_to_sighup(tmp_path: Path, hup_child: HupChild) -> None:
    reloader = RuntimeReloader(
        "crio.service", pid_file=hup_child.pid_file, bus_address=f"unix:path={tmp_path}/no-bus"
    )
    assert await reloader.reload() == "sighup"
    assert await hup_child.exit_code() == 0


async def test_fallback_without_pid_file_fails(bus_address: str) -> None:
    reloader = RuntimeReloader("crio.service", pid_file=None, bus_address=bus_address)
    with pytest.raises(RuntimeReloadFailed, match="no pid file is configured"):
        await reloader.reload()


REFUSAL_PROBE = """
import asyncio, json, os, signal, sys
from pathlib import Path
from nodeagent.adapters.systemd import RuntimeReloader
from nodeagent.errors import RuntimeReloadFailed

hups = []
signal.signal(signal.SIGHUP, lambda *_: hups.append(1))
bus_address, pid_file, content = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
pid_file.write_text(str(os.getpid()) if content == "OWN" else content)

async def reload():
    try:
        return await RuntimeReloader(
            "crio.service", pid_file=pid_file, bus_address=bus_address
        ).reload()
    except RuntimeReloadFailed as exc:
        return exc.message

outcome = asyncio.run(reload())
print(json.dumps({"pid": os.getpid(), "outcome": outcome, "hups": len(hups)}))
"""
"""Runs as PID 1 of its own PID namespace (``unshare``) and leader of its own session and
process group (``setsid``), so the PIDs a bad pid file names ("0": its process group, "1",
its own) are the probe itself, which records every SIGHUP, and "-5" is no group at all:
a refusal is checked against real signals, and a mistake could never reach this machine's
init or the test runner."""


UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc", "--", "setsid")


@pytest.mark.parametrize("content", ["", "abc", "0", "1", "-5", "12 34", "OWN"])
def test_fallback_refuses_pid_file_without_a_runtime_pid(
    bus_address: str, tmp_path: Path, content: str
) -> None:
    pid_file = tmp_path / "runtime.pid"
    probe = subprocess.run(
        [*UNSHARE, sys.executable, "-c", REFUSAL_PROBE, bus_address, str(pid_file), content],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout.splitlines()[-1])  # after the log lines
    assert result["pid"] == 1
    assert "not the PID of a runtime process" in result["outcome"]
    assert result["hups"] == 0


async def test_fallback_to_a_gone_process_fails(bus_address: str, tmp_path: Path) -> None:
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await asyncio.wait_for(gone.wait(), 10)
    pid_file = tmp_path / "runtime.pid"
    pid_file.write_text(str(gone.pid))
    reloader = RuntimeReloader("crio.service", pid_file=pid_file, bus_address=bus_address)
    with pytest.raises(RuntimeReloadFailed, match="is the runtime running") as info:
        await reloader.reload()
    assert isinstance(info.value.__cause__, ProcessLookupError)


async def test_missing_pid_file_fails(bus_address: str, tmp_path: Path) -> None:
    reloader = RuntimeReloader(
        "crio.service", pid_file=tmp_path / "absent.pid", bus_address=bus_address
    )
    with pytest.raises(RuntimeReloadFailed, match=r"absent\.pid") as info:
        await reloader.reload()
    assert isinstance(info.value.__cause__, FileNotFoundError)


async def test_confirm_runs_after_the_signal(bus_address: str, hup_child: HupChild) -> None:
    seen: list[bool] = []

    async def confirm() -> None:
        await hup_child.exit_code()
        seen.append(hup_child.marker.exists())

    reloader = RuntimeReloader(
        "crio.service", pid_file=hup_child.pid_file, bus_address=bus_address, confirm=confirm
    )
    assert await reloader.reload() == "sighup"
    assert seen == [True]


async def test_unconfirmed_reload_fails(bus_address: str, hup_child: HupChild) -> None:
    never = asyncio.Event()

    async def confirm() -> None:
        await never.wait()

    reloader = RuntimeReloader(
        "crio.service",
        pid_file=hup_child.pid_file,
        bus_address=bus_address,
        timeout_s=0.3,
        confirm=confirm,
    )
    with pytest.raises(RuntimeReloadFailed, match="not confirmed"):
        await reloader.reload()


async def test_malformed_bus_address_is_a_config_error(tmp_path: Path) -> None:
    reloader = RuntimeReloader("crio.service", pid_file=tmp_path / "x", bus_address="nonsense")
    with pytest.raises(ConfigInvalid, match="nonsense"):
        await reloader.reload()


# ---------------------------------------------------------------- sd_notify


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify")
    assert len(path) < 108, "AF_UNIX path too long for this tmp_path"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(5)
        yield sock, path


def test_notifier_sends_ready_status_watchdog_stopping(
    notify_socket: tuple[socket.socket, str],
) -> None:
    sock, path = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.is_enabled
    assert notifier.ready("3 sets pinned")
    assert sock.recv(4096) == b"READY=1\nSTATUS=3 sets pinned"
    assert notifier.status("pulling 2 of 5\nimages")
    assert sock.recv(4096) == b"STATUS=pulling 2 of 5 images"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.stopping()
    assert sock.recv(4096) == b"STOPPING=1"


def test_notifier_uses_abstract_sockets() -> None:
    name = f"nodeagent-test-{os.getpid()}-{id(object())}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert sock.recv(4096) == b"READY=1"


def test_notifier_without_socket_is_a_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.is_enabled
    assert not notifier.ready()
    assert notifier.watchdog_interval_s() is None


def test_notifier_survives_a_vanished_socket(tmp_path: Path) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert notifier.watchdog() is False


@pytest.mark.parametrize(
    ("env", "expected_s"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "5000000"}, 5.0),
        ({"WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "OWN"}, 5.0),
        ({"WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected_s: float | None) -> None:
    env = {k: str(os.getpid()) if v == "OWN" else v for k, v in env.items()}
    assert Notifier(env).watchdog_interval_s() == expected_s

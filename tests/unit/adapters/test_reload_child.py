"""The reload runs in a child process (dbus-fast stays out of the daemon): what the daemon
does with a child that fails unexpectedly, hangs, or is still running when the daemon stops.

The D-Bus outcomes themselves are tested through the child against a real dbus-daemon
(tests/service/test_systemd_jobs.py, tests/integration/adapters/test_systemd.py)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from nodeagent.adapters import systemd
from nodeagent.adapters.systemd import RuntimeReloader
from nodeagent.errors import RuntimeReloadFailed
from tests.testenv.waiting import wait_for_async


def sleeper(pid_file: Path) -> str:
    """A child that writes its PID, then sleeps a minute."""
    return f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"


def is_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def child(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    """Make the reloader start ``python -c code`` instead of the D-Bus child."""
    monkeypatch.setattr(systemd, "reload_command", lambda *_args: [sys.executable, "-c", code])


async def test_a_child_that_crashes_is_a_reload_failure_naming_its_last_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # what an uncaught exception does: a traceback on stderr, exit 1
    child(
        monkeypatch,
        "import sys; sys.stderr.write('Traceback\\nValueError: \\x1b[31mboom\\n'); sys.exit(1)",
    )
    with pytest.raises(RuntimeReloadFailed) as caught:
        await RuntimeReloader("crio.service", timeout_s=5).reload()
    assert "failed (exit 1)" in caught.value.message
    assert "ValueError: \\x1b[31mboom" in caught.value.message  # escaped for the journal


async def test_a_child_that_outlasts_its_bound_is_killed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    child(monkeypatch, sleeper(pid_file))
    monkeypatch.setattr(systemd, "CHILD_GRACE_S", 3.0)
    with pytest.raises(RuntimeReloadFailed, match=r"did not finish within 3\.2 s"):
        await RuntimeReloader("crio.service", timeout_s=0.1).reload()
    pid = int(pid_file.read_text())
    assert not is_alive(pid)


async def test_a_helper_that_cannot_start_is_a_reload_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-interpreter")
    monkeypatch.setattr(systemd, "reload_command", lambda *_args: [missing, "-c", "pass"])
    with pytest.raises(RuntimeReloadFailed, match="cannot start the helper"):
        await RuntimeReloader("crio.service", timeout_s=5).reload()


async def test_a_reload_cancelled_by_the_stop_leaves_no_child(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    child(monkeypatch, sleeper(pid_file))
    reloading = asyncio.create_task(RuntimeReloader("crio.service", timeout_s=30).reload())

    async def started() -> int | None:
        return int(pid_file.read_text()) if pid_file.exists() and pid_file.read_text() else None

    pid = await wait_for_async(started, timeout_s=10, what="the child started")
    reloading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reloading
    assert not is_alive(pid)
    assert os.getpid() != pid

"""What ``RuntimeReloader`` may expect of systemd's Manager: one set of assertions, two peers.

tests/service/test_systemd_jobs.py runs them against the stand-in
(tests/fakes/systemd_manager.py, fast, on a private dbus-daemon); tests/e2e/test_systemd_jobs.py
runs the same functions against the real systemd of a node booted under nspawn, whose units
are named below. What the real one showed and the stand-in now mirrors: a missing unit is
refused with ``NoSuchUnit`` before any job exists, a reload of an inactive unit is a job that
ends ``invalid``, a failing ``ExecReload=`` ends ``failed``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.adapters.systemd import RuntimeReloader
from nodeagent.errors import RuntimeReloadFailed
from tests.testenv.dbus import HupChild

RELOADS = "crio.service"
"""Its reload job ends ``done``."""
RELOAD_FAILS = "e2e-reload-fails.service"
"""Active; ``ExecReload=/bin/false``: its reload job ends ``failed``."""
RELOAD_HANGS = "e2e-reload-hangs.service"
"""Active; ``ExecReload=`` never returns: its reload job does not end."""
INACTIVE = "e2e-inactive.service"
"""Exists, not started: a reload job ends ``invalid``."""
MISSING = "nosuch.service"
"""No such unit."""


@dataclass(frozen=True)
class Manager:
    """A systemd Manager on a bus; ``calls`` lists the methods it received (the stand-in's)."""

    address: str
    calls: Callable[[], list[str]] | None = None


def reloader(
    manager: Manager, unit: str, *, pid_file: Path | None, timeout_s: float = 60.0
) -> RuntimeReloader:
    return RuntimeReloader(
        unit, pid_file=pid_file, bus_address=manager.address, timeout_s=timeout_s
    )


async def reload_waits_for_done(manager: Manager) -> None:
    assert await reloader(manager, RELOADS, pid_file=None).reload() == "dbus"
    if manager.calls is not None:
        assert manager.calls() == ["Subscribe", f"ReloadUnit {RELOADS} replace"]


async def failed_job_is_an_error(manager: Manager) -> None:
    with pytest.raises(RuntimeReloadFailed, match="ended with 'failed'") as info:
        await reloader(manager, RELOAD_FAILS, pid_file=None).reload()
    assert info.value.reason == "RuntimeReloadFailed"


async def inactive_unit_is_an_invalid_job(manager: Manager) -> None:
    with pytest.raises(RuntimeReloadFailed, match="ended with 'invalid'"):
        await reloader(manager, INACTIVE, pid_file=None).reload()


async def hung_job_times_out_without_fallback(manager: Manager, child: HupChild) -> None:
    hanging = reloader(manager, RELOAD_HANGS, pid_file=child.pid_file, timeout_s=0.5)
    with pytest.raises(RuntimeReloadFailed, match=r"within 0\.5s"):
        await hanging.reload()
    assert child.process.returncode is None  # no SIGHUP once systemd took the job
    assert not child.marker.exists()


async def missing_unit_fails_without_fallback(manager: Manager, child: HupChild) -> None:
    with pytest.raises(RuntimeReloadFailed, match="NoSuchUnit"):
        await reloader(manager, MISSING, pid_file=child.pid_file).reload()
    assert not child.marker.exists()

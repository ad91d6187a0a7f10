"""Service test: the reloader's D-Bus job handling, against a stand-in systemd Manager.

A real private dbus-daemon carries the calls and tests/fakes/systemd_manager.py exports the
Manager methods and JobRemoved signals on it. The assertions live in systemd_jobs_contract.py
and run against the real systemd of a booted node too (tests/e2e/test_systemd_jobs.py); the
stand-in adds only what a real systemd cannot be made to do on purpose: end a job before
replying to the call that queued it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from dbus_fast.aio import MessageBus

from tests.fakes.systemd_manager import FakeBehaviour, serve_fake_manager
from tests.service import systemd_jobs_contract as contract
from tests.testenv.dbus import HupChild


@pytest.fixture
async def fake_systemd(bus_address: str) -> AsyncIterator[FakeBehaviour]:
    behaviour = FakeBehaviour(
        units={
            contract.RELOADS: "done",
            contract.RELOAD_FAILS: "failed",
            contract.RELOAD_HANGS: None,
            contract.INACTIVE: "invalid",
        }
    )
    bus: MessageBus = await serve_fake_manager(bus_address, behaviour)
    yield behaviour
    bus.disconnect()
    await asyncio.wait_for(bus.wait_for_disconnect(), 5)  # type: ignore[no-untyped-call]


@pytest.fixture
def manager(bus_address: str, fake_systemd: FakeBehaviour) -> contract.Manager:
    return contract.Manager(bus_address, calls=lambda: list(fake_systemd.calls))


async def test_dbus_reload_waits_for_done(manager: contract.Manager) -> None:
    await contract.reload_waits_for_done(manager)


async def test_dbus_reload_reports_failed_job(manager: contract.Manager) -> None:
    await contract.failed_job_is_an_error(manager)


async def test_dbus_reload_of_an_inactive_unit_is_an_invalid_job(
    manager: contract.Manager,
) -> None:
    await contract.inactive_unit_is_an_invalid_job(manager)


async def test_dbus_reload_times_out_on_a_hung_job(
    manager: contract.Manager, hup_child: HupChild
) -> None:
    await contract.hung_job_times_out_without_fallback(manager, hup_child)


async def test_dbus_reload_of_unknown_unit_fails_without_fallback(
    manager: contract.Manager, hup_child: HupChild
) -> None:
    await contract.missing_unit_fails_without_fallback(manager, hup_child)


async def test_dbus_reload_sees_a_job_that_ends_before_the_reply(
    manager: contract.Manager, fake_systemd: FakeBehaviour
) -> None:
    fake_systemd.emit_before_reply = True
    reloader = contract.reloader(manager, contract.RELOADS, pid_file=None, timeout_s=5)
    assert await reloader.reload() == "dbus"

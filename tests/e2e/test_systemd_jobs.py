"""The reloader's contract with systemd, against the real systemd of a booted node.

The same assertions as the stand-in's (tests/service/systemd_jobs_contract.py), over the
node's own system bus (its socket reached through /proc/<leader>/root), with real units:
crio.service, and three small units whose reloads fail, hang, or cannot run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.service import systemd_jobs_contract as contract
from tests.testenv.dbus import HupChild
from tests.testenv.node import Node
from tests.testenv.waiting import wait_for

UNITS = {
    contract.RELOAD_FAILS: "ExecStart=/bin/sleep infinity\nExecReload=/bin/false\n",
    contract.RELOAD_HANGS: "ExecStart=/bin/sleep infinity\nExecReload=/bin/sleep infinity\n",
    contract.INACTIVE: "ExecStart=/bin/sleep infinity\nExecReload=/bin/true\n",
}


@pytest.fixture(scope="module")
def manager(node: Node) -> Iterator[contract.Manager]:
    for name, service in UNITS.items():
        path = node.root / "etc/systemd/system" / name
        path.write_text(f"[Unit]\nDescription=nodeagent e2e: {name}\n\n[Service]\n{service}")
    node.container.systemctl("daemon-reload")
    node.container.systemctl("start", contract.RELOAD_FAILS, contract.RELOAD_HANGS)
    yield contract.Manager(node.bus_address)
    node.container.systemctl("stop", *UNITS, check=False)


def crio_reloads(node: Node) -> int:
    return node.journal("-b", "-u", "crio", "-o", "cat").count("Configuration reload completed")


async def test_dbus_reload_waits_for_done(manager: contract.Manager, node: Node) -> None:
    before = crio_reloads(node)
    await contract.reload_waits_for_done(manager)
    # "done" means delivered: CRI-O re-reads its files just after (docs/pins.md).
    wait_for(lambda: crio_reloads(node) > before, timeout_s=30, what="CRI-O's reload")


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

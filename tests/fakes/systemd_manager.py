"""A FAKE of systemd's ``org.freedesktop.systemd1.Manager``, for a private dbus-daemon.

Only what ``RuntimeReloader`` uses: ``Subscribe`` and ``ReloadUnit`` (which
returns a job path and later emits ``JobRemoved(id, job, unit, result)``).
It exists so the D-Bus job-waiting logic can be tested fast on a private bus;
tests/service/systemd_jobs_contract.py holds the assertions, which
tests/e2e/test_systemd_jobs.py runs against the real systemd of a booted node.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated

from dbus_fast import DBusError
from dbus_fast.aio import MessageBus
from dbus_fast.annotations import DBusObjectPath, DBusSignature, DBusStr
from dbus_fast.service import ServiceInterface, dbus_method, dbus_signal

BUS_NAME = "org.freedesktop.systemd1"
OBJECT_PATH = "/org/freedesktop/systemd1"
INTERFACE = "org.freedesktop.systemd1.Manager"

JobRemovedBody = Annotated[tuple[int, str, str, str], DBusSignature("uoss")]


@dataclass
class FakeBehaviour:
    """How the fake answers ``ReloadUnit``."""

    units: dict[str, str | None] = field(default_factory=lambda: {"crio.service": "done"})
    """Units that exist, each with the result its reload job's ``JobRemoved`` reports ("done",
    "failed", "invalid", ...); None: the job never ends. Other units get ``NoSuchUnit``."""
    delay_s: float = 0.05
    """When a job ends after the reply."""
    emit_before_reply: bool = False
    """End the job before replying, the race a late subscription would lose."""
    decoy_first: bool = True
    """First emit a ``JobRemoved`` of an unrelated job whose result is the opposite one."""
    calls: list[str] = field(default_factory=list)
    """Method calls received, e.g. ``["Subscribe", "ReloadUnit crio.service replace"]``."""


class FakeSystemdManager(ServiceInterface):
    """The fake Manager interface; behaviour is set per test through ``FakeBehaviour``."""

    def __init__(self, behaviour: FakeBehaviour) -> None:
        super().__init__(INTERFACE)
        self.behaviour = behaviour
        self._next_job = 100

    # No return annotation: under PEP 563 dbus-fast reads "None" as a signature.
    @dbus_method()
    def Subscribe(self):  # type: ignore[no-untyped-def]
        self.behaviour.calls.append("Subscribe")

    @dbus_method()
    def ReloadUnit(self, name: DBusStr, mode: DBusStr) -> DBusObjectPath:
        self.behaviour.calls.append(f"ReloadUnit {name} {mode}")
        if name not in self.behaviour.units:
            raise DBusError("org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not found.")
        result = self.behaviour.units[name]
        self._next_job += 1
        job_id, job = self._next_job, f"{OBJECT_PATH}/job/{self._next_job}"
        if result is None:
            return job  # a job that never ends
        if self.behaviour.emit_before_reply:
            self._finish(job_id, job, name, result)
        else:
            loop = asyncio.get_running_loop()
            loop.call_later(self.behaviour.delay_s, self._finish, job_id, job, name, result)
        return job

    def _finish(self, job_id: int, job: str, unit: str, result: str) -> None:
        if self.behaviour.decoy_first:
            decoy = "failed" if result == "done" else "done"
            self.JobRemoved(job_id + 1000, f"{OBJECT_PATH}/job/{job_id + 1000}", unit, decoy)
        self.JobRemoved(job_id, job, unit, result)

    @dbus_signal()
    def JobRemoved(self, job_id: int, job: str, unit: str, result: str) -> JobRemovedBody:
        return (job_id, job, unit, result)


async def serve_fake_manager(address: str, behaviour: FakeBehaviour) -> MessageBus:
    """Connect to ``address``, export the fake and own ``org.freedesktop.systemd1``."""
    bus = await MessageBus(bus_address=address).connect()
    bus.export(OBJECT_PATH, FakeSystemdManager(behaviour))
    await bus.request_name(BUS_NAME)
    return bus

"""systemd over D-Bus: reload a unit and wait for its job, or read a unit's state
(dbus-fast), in a child process.

``systemd.RuntimeReloader`` runs this module as a short-lived child of the daemon
(``systemd.reload_command``): dbus-fast (about 2.7 MiB resident, with the XML parser it loads)
never enters the daemon, whose idle memory has a budget (docs/performance.md), and a
reload, which happens only when the pins change, costs the child's start (about 0.2 s).

The child's answer is its exit code (``systemd.EXIT_*``), with one line of text on
stdout for the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from typing import Final

import structlog
from dbus_fast import BusType, DBusFastError, InvalidAddressError, Message, MessageType
from dbus_fast.aio import MessageBus

from nodeagent.adapters.systemd import (
    EXIT_ADDRESS_INVALID,
    EXIT_BUS_UNREACHABLE,
    EXIT_NO_SYSTEMD,
    EXIT_RELOAD_FAILED,
    EXIT_RELOADED,
)
from nodeagent.errors import ConfigInvalid, RuntimeReloadFailed
from nodeagent.strict import clip

log = structlog.get_logger(__name__)

SYSTEMD_BUS_NAME: Final = "org.freedesktop.systemd1"
SYSTEMD_PATH: Final = "/org/freedesktop/systemd1"
MANAGER_INTERFACE: Final = "org.freedesktop.systemd1.Manager"
UNIT_INTERFACE: Final = "org.freedesktop.systemd1.Unit"
JOB_REMOVED_RULE: Final = (
    f"type='signal',sender='{SYSTEMD_BUS_NAME}',path='{SYSTEMD_PATH}',"
    f"interface='{MANAGER_INTERFACE}',member='JobRemoved'"
)
"""Match rule for the end of systemd jobs; added BEFORE a job starts so its end is never missed."""

_NO_SYSTEMD: Final = frozenset(
    {"org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"}
)
_BUS_ERRORS: Final = (OSError, EOFError, DBusFastError)
_DISCONNECT_TIMEOUT_S: Final = 2.0


class NoSystemd(Exception):
    """The bus works but systemd is not on it: use the fallback."""


class BusUnreachable(Exception):
    """The bus could not be reached (no socket, refused, timed out)."""


async def connect(bus_address: str | None, timeout_s: float) -> MessageBus:
    """A connection to ``bus_address`` (default: the system bus)."""
    try:
        bus = MessageBus(bus_address=bus_address, bus_type=BusType.SYSTEM)
    except InvalidAddressError as err:
        raise ConfigInvalid(f"invalid D-Bus address {bus_address!r}: {err}") from err
    try:
        async with asyncio.timeout(timeout_s):
            return await bus.connect()
    except (*_BUS_ERRORS, TimeoutError) as err:
        raise BusUnreachable(str(err) or type(err).__name__) from err


async def reload_unit(bus: MessageBus, unit: str, timeout_s: float) -> None:
    """``ReloadUnit(unit, "replace")``, then wait for its job to end ``done``."""
    try:
        async with asyncio.timeout(timeout_s):
            await _run_job(bus, unit)
    except TimeoutError as err:
        raise RuntimeReloadFailed(
            f"systemd did not finish reloading {unit} within {timeout_s:g}s; "
            f"check `systemctl status {unit}`"
        ) from err
    except _BUS_ERRORS as err:
        raise RuntimeReloadFailed(f"lost the system bus while reloading {unit}: {err}") from err


async def _run_job(bus: MessageBus, unit: str) -> None:
    jobs = _JobResults()
    bus.add_message_handler(jobs.handle)
    bus_daemon = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")
    await _checked(bus, _call(*bus_daemon, "AddMatch", JOB_REMOVED_RULE), "add match rule")
    manager = (SYSTEMD_BUS_NAME, SYSTEMD_PATH, MANAGER_INTERFACE)
    await _checked(bus, _call(*manager, "Subscribe"), "subscribe to systemd")
    reply = await _checked(bus, _call(*manager, "ReloadUnit", unit, "replace"), f"reload {unit}")
    job = str(reply.body[0])
    log.debug("reload_job_queued", unit=unit, job=job)
    result = await jobs.result_of(job)
    if result != "done":
        raise RuntimeReloadFailed(
            f"systemd's reload job for {unit} ended with {result!r}; see `journalctl -u {unit}`"
        )


class _JobResults:
    """``JobRemoved`` outcomes seen on the bus, by job object path."""

    def __init__(self) -> None:
        self.results: dict[str, str] = {}
        self._seen = asyncio.Event()

    def handle(self, msg: Message) -> None:
        if (
            msg.message_type is MessageType.SIGNAL
            and msg.interface == MANAGER_INTERFACE
            and msg.member == "JobRemoved"
            and msg.signature == "uoss"
        ):
            _job_id, job, _unit, result = msg.body
            self.results[job] = result
            self._seen.set()

    async def result_of(self, job: str) -> str:
        while job not in self.results:
            self._seen.clear()
            await self._seen.wait()
        return self.results[job]


def _call(destination: str, path: str, interface: str, member: str, *args: str) -> Message:
    return Message(
        destination=destination,
        path=path,
        interface=interface,
        member=member,
        signature="s" * len(args),
        body=list(args),
    )


async def _checked(bus: MessageBus, msg: Message, what: str) -> Message:
    """Call and return the reply; error replies become ``_NoSystemd`` or ``RuntimeReloadFailed``."""
    reply = await bus.call(msg)
    if reply.message_type is not MessageType.ERROR:
        return reply
    name = reply.error_name or "unknown"
    if name in _NO_SYSTEMD:
        raise NoSystemd(name)
    text = reply.body[0] if reply.body else ""
    raise RuntimeReloadFailed(f"systemd refused to {what}: {name}: {text}")


async def disconnect(bus: MessageBus) -> None:
    bus.disconnect()
    with contextlib.suppress(*_BUS_ERRORS, TimeoutError):
        async with asyncio.timeout(_DISCONNECT_TIMEOUT_S):
            # dbus-fast 5.2 leaves wait_for_disconnect unannotated.
            await bus.wait_for_disconnect()  # type: ignore[no-untyped-call]


async def reload_via_bus(unit: str, timeout_s: float, bus_address: str | None) -> None:
    """Connect, reload ``unit`` and wait for its job, disconnect (the child's whole work)."""
    bus = await connect(bus_address, timeout_s)
    try:
        await reload_unit(bus, unit, timeout_s)
    finally:
        await disconnect(bus)


async def unit_state(bus: MessageBus, unit: str, timeout_s: float) -> tuple[str, str]:
    """``unit``'s ``ActiveState`` and ``SubState`` (``LoadUnit``: a unit not loaded yet is
    loaded, and one that does not exist says ``inactive dead``)."""
    manager = (SYSTEMD_BUS_NAME, SYSTEMD_PATH, MANAGER_INTERFACE)
    async with asyncio.timeout(timeout_s):
        reply = await _checked(bus, _call(*manager, "LoadUnit", unit), f"look up {unit}")
        path = str(reply.body[0])
        found = []
        for name in ("ActiveState", "SubState"):
            get = (SYSTEMD_BUS_NAME, path, "org.freedesktop.DBus.Properties", "Get")
            answer = await _checked(bus, _call(*get, UNIT_INTERFACE, name), f"read {unit}")
            found.append(clip(str(answer.body[0].value), 32))
    return found[0], found[1]


async def state_via_bus(unit: str, timeout_s: float, bus_address: str | None) -> tuple[str, str]:
    bus = await connect(bus_address, timeout_s)
    try:
        return await unit_state(bus, unit, timeout_s)
    finally:
        await disconnect(bus)


def _state_main(unit: str, timeout_text: str, address: str) -> int:
    """``--state UNIT TIMEOUT_S BUS_ADDRESS``: print ``ActiveState SubState``."""
    try:
        active, sub = asyncio.run(state_via_bus(unit, float(timeout_text), address or None))
    except BusUnreachable as err:
        return _answer(EXIT_BUS_UNREACHABLE, str(err))
    except NoSystemd as err:
        return _answer(EXIT_NO_SYSTEMD, str(err))
    except (RuntimeReloadFailed, TimeoutError, *_BUS_ERRORS) as err:
        return _answer(EXIT_RELOAD_FAILED, getattr(err, "message", str(err)))
    except ConfigInvalid as err:
        return _answer(EXIT_ADDRESS_INVALID, err.message)
    return _answer(EXIT_RELOADED, f"{active} {sub}")


def main(argv: Sequence[str]) -> int:
    """``UNIT TIMEOUT_S BUS_ADDRESS`` (empty: the system bus): reload, say how it went;
    ``--state UNIT TIMEOUT_S BUS_ADDRESS``: say the unit's state."""
    # stdout carries the answer: the daemon's structured log lines are not wanted here
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    if argv and argv[0] == "--state":
        return _state_main(*argv[1:4])
    unit, timeout_text, address = argv
    try:
        asyncio.run(reload_via_bus(unit, float(timeout_text), address or None))
    except BusUnreachable as err:
        return _answer(EXIT_BUS_UNREACHABLE, str(err))
    except NoSystemd as err:
        return _answer(EXIT_NO_SYSTEMD, str(err))
    except RuntimeReloadFailed as err:
        return _answer(EXIT_RELOAD_FAILED, err.message)
    except ConfigInvalid as err:
        return _answer(EXIT_ADDRESS_INVALID, err.message)
    return _answer(EXIT_RELOADED, f"systemd reloaded {unit}")


def _answer(code: int, text: str) -> int:
    sys.stdout.write(clip(text, 500) + "\n")
    return code

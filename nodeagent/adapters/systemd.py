"""systemd: readiness and watchdog notifications (sd_notify), and reloading the runtime.

``Notifier`` speaks the sd_notify datagram protocol with the standard library
only. ``RuntimeReloader`` asks systemd over the system bus (dbus-fast, in
``systemd_bus``, run as a short-lived child process) to reload the runtime's unit
and waits for that job's outcome; without systemd on the bus it sends SIGHUP to
the PID in a pid file instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import structlog

from nodeagent.config.addresses import Address
from nodeagent.errors import ConfigInvalid, RuntimeReloadFailed
from nodeagent.strict import clip

if TYPE_CHECKING:
    from nodeagent.mirror.activation import SocketFacts

log = structlog.get_logger(__name__)

CHILD_GRACE_S = 15.0
"""Beyond the reload's own bound: the child's start, its connection and its exit."""
CHILD_OUTPUT_BYTES = 4096
"""The end of the child's output kept for the journal (its answer is one line)."""

EXIT_RELOADED = 0
EXIT_BUS_UNREACHABLE = 10
EXIT_NO_SYSTEMD = 11
EXIT_RELOAD_FAILED = 12
EXIT_ADDRESS_INVALID = 13
"""The reload child's exit codes (``systemd_bus.main``): reloaded; no bus, or no systemd on
it (the daemon signals the runtime instead); the job failed; a malformed bus address."""


def reload_command(unit: str, timeout_s: float, bus_address: str | None) -> list[str]:
    """The reload child's command line: this interpreter, isolated, with the daemon's module
    path (the RPM's launcher puts nodeagent's directories first; the child sees the same)."""
    code = (
        f"import sys; sys.path[:0] = {sys.path!r}; "
        "from nodeagent.adapters.systemd_bus import main; sys.exit(main(sys.argv[1:]))"
    )
    return [sys.executable, "-I", "-c", code, unit, repr(timeout_s), bus_address or ""]


def state_command(unit: str, timeout_s: float, bus_address: str | None) -> list[str]:
    """The state child's command line (``systemd_bus.main --state``)."""
    command = reload_command(unit, timeout_s, bus_address)
    return [*command[:4], "--state", *command[4:]]


async def socket_unit_state(
    unit: str, bus_address: str | None, timeout_s: float = 10.0
) -> tuple[str, str] | None:
    """``unit``'s ``ActiveState`` and ``SubState`` as systemd says them, asked in a
    short-lived child (dbus-fast stays out of the daemon); None when it could not be asked
    (no bus, no systemd: the caller says "unknown", never guesses)."""
    try:
        child = await asyncio.create_subprocess_exec(
            *state_command(unit, timeout_s, bus_address),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as err:
        log.debug("unit_state_not_asked", unit=unit, error=str(err))
        return None
    try:
        async with asyncio.timeout(timeout_s + CHILD_GRACE_S):
            out, _err = await child.communicate()
    except BaseException as stopped:  # a timeout, or the daemon stopping: never left behind
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
        if isinstance(stopped, TimeoutError):
            log.debug("unit_state_not_asked", unit=unit, error="timed out")
            return None
        raise
    said = out[-CHILD_OUTPUT_BYTES:].decode(errors="replace").strip()
    words = said.split()
    if child.returncode != EXIT_RELOADED or len(words) != 2:
        log.debug("unit_state_not_asked", unit=unit, error=clip(said, 200))
        return None
    return words[0], words[1]


ReloadPath = Literal["dbus", "sighup"]
"""How a reload was delivered: by a systemd job, or by a signal to the runtime's PID."""

# ---------------------------------------------------------------- sd_notify


def _notify_address(value: str) -> str | None:
    """The socket address in ``NOTIFY_SOCKET``: a path, or ``@name`` for an abstract socket."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


class Notifier:
    """Tell the service manager about readiness, status and liveness (sd_notify).

    Reads ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` from
    ``environ`` (default ``os.environ``) when built. Without ``NOTIFY_SOCKET``
    (not started by systemd) every call is a no-op that returns False.
    Sends never block the event loop: a full receive queue drops the message.
    Failures are logged once per transition and never raised: the manager's own
    timeouts (start, watchdog) are the consequence, and the right one.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self._address = _notify_address(raw)
        if raw and self._address is None:
            log.warning("notify_socket_unsupported", notify_socket=raw)
        self._watchdog_usec = env.get("WATCHDOG_USEC", "")
        self._watchdog_pid = env.get("WATCHDOG_PID", "")
        self._is_failing = False

    @property
    def is_enabled(self) -> bool:
        """True if a service manager listens for notifications."""
        return self._address is not None

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=value`` lines (e.g. ``READY=1``); True if the datagram was sent."""
        if self._address is None:
            return False
        lines = (f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items())
        payload = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)
                sock.sendto(payload, self._address)
        except OSError as err:
            if not self._is_failing:
                log.warning("notify_failed", error=str(err), fields=sorted(fields))
            self._is_failing = True
            return False
        if self._is_failing:
            log.info("notify_recovered")
        self._is_failing = False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Startup finished (``READY=1``), optionally with a status line."""
        return self.notify(READY=1) if status is None else self.notify(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """A one-line status that ``systemctl status`` shows."""
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        """Still alive (``WATCHDOG=1``); send at about half of ``watchdog_interval_s``."""
        return self.notify(WATCHDOG=1)

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown started (``STOPPING=1``)."""
        return self.notify(STOPPING=1) if status is None else self.notify(STOPPING=1, STATUS=status)

    def watchdog_interval_s(self) -> float | None:
        """The watchdog timeout systemd enforces on this process, or None if there is none."""
        if self._watchdog_pid and self._watchdog_pid != str(os.getpid()):
            return None
        try:
            usec = int(self._watchdog_usec)
        except ValueError:
            return None
        return usec / 1_000_000 if usec > 0 else None


# ---------------------------------------------------------------- reload


class RuntimeReloader:
    """Reload the container runtime after its configuration changed.

    Primary path ("dbus"): ``Manager.ReloadUnit(unit, "replace")`` over the
    system bus (or ``bus_address``), then wait for that job's ``JobRemoved``
    signal and require the result ``done``. The signal subscription is in
    place before the job is queued, so a fast job cannot be missed. A
    connection is opened per reload: reloads are rare and this survives
    restarts of the bus.

    Fallback ("sighup"): when the bus cannot be reached, or systemd is not on
    it, SIGHUP goes to the PID in ``pid_file``. Nothing reports the outcome
    of a signal.

    Either way, "done" only means the reload was delivered: CRI-O's unit
    reloads with ``kill -HUP $MAINPID``, which finishes before CRI-O has
    re-read its files. ``confirm``, if given, is awaited after either path
    (within ``timeout_s``) to observe the effect, e.g. the runtime answering
    CRI again; nodeagent verifies pins through CRI afterwards in any case.

    Errors: ``RuntimeReloadFailed`` (transient) for a refused or failed job,
    a timeout, or a missing runtime process; ``ConfigInvalid`` for a
    malformed ``bus_address``.
    """

    def __init__(
        self,
        unit: str,
        *,
        pid_file: Path | None = None,
        bus_address: str | None = None,
        timeout_s: float = 60.0,
        confirm: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.unit = unit
        self.pid_file = pid_file
        self.bus_address = bus_address
        self.timeout_s = timeout_s
        self.confirm = confirm
        self._fallback_reason: str | None = None

    async def reload(self) -> ReloadPath:
        """Reload the runtime; return the path used ("dbus" or "sighup")."""
        started = time.monotonic()
        path: ReloadPath = "dbus" if await self._reload_via_dbus() else "sighup"
        if path == "dbus":
            self._fallback_reason = None
        if path == "sighup":
            self._send_sighup()
        await self._confirm()
        log.info(
            "runtime_reloaded",
            unit=self.unit,
            path=path,
            seconds=round(time.monotonic() - started, 3),
        )
        return path

    def _note_fallback(self, event: str, **fields: str) -> None:
        """Log why SIGHUP is used, once per change of reason (not at every reload)."""
        if self._fallback_reason != event:
            self._fallback_reason = event
            log.info(event, fallback="sighup", **fields)

    async def _reload_via_dbus(self) -> bool:
        """Reload through systemd, in a child process (``systemd_bus``: dbus-fast stays out
        of the daemon); False if there is no systemd to ask."""
        code, said = await self._run_child(
            reload_command(self.unit, self.timeout_s, self.bus_address)
        )
        if code == EXIT_RELOADED:
            return True
        if code == EXIT_BUS_UNREACHABLE:
            self._note_fallback("system_bus_unreachable", error=said)
            return False
        if code == EXIT_NO_SYSTEMD:
            self._note_fallback("systemd_not_on_bus", unit=self.unit)
            return False
        if code == EXIT_ADDRESS_INVALID:
            raise ConfigInvalid(f"invalid D-Bus address {self.bus_address!r}: {said}")
        if code == EXIT_RELOAD_FAILED:
            raise RuntimeReloadFailed(said)
        raise RuntimeReloadFailed(
            f"the helper that asks systemd to reload {self.unit} failed (exit {code}): {said}"
        )

    async def _run_child(self, command: list[str]) -> tuple[int, str]:
        """Run ``command``; its exit code and what it said (stdout, else stderr's last line),
        clipped. It is killed if it outlasts its own timeout by ``CHILD_GRACE_S``."""
        bound_s = 2 * self.timeout_s + CHILD_GRACE_S
        try:
            child = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as failed:  # no process left for this unit (TasksMax=), no interpreter
            raise RuntimeReloadFailed(
                f"cannot start the helper that asks systemd to reload {self.unit}: "
                f"{failed.strerror or failed}"
            ) from failed
        try:
            async with asyncio.timeout(bound_s):
                out, err = await child.communicate()
        except BaseException as stopped:  # a timeout, or the daemon stopping: never left behind
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()
            if isinstance(stopped, TimeoutError):
                raise RuntimeReloadFailed(
                    f"the helper that asks systemd to reload {self.unit} did not finish "
                    f"within {bound_s:g} s; it was stopped (check `systemctl status {self.unit}`)"
                ) from stopped
            raise
        lines = (out or err)[-CHILD_OUTPUT_BYTES:].decode(errors="replace").strip().splitlines()
        return child.returncode if child.returncode is not None else -1, clip(
            lines[-1] if lines else "", 500
        )

    def _read_pid(self) -> int:
        if self.pid_file is None:
            raise RuntimeReloadFailed(
                f"cannot reload {self.unit}: systemd is not reachable on the bus and no pid "
                "file is configured; run the runtime under systemd or configure its pid file"
            )
        try:
            text = self.pid_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise RuntimeReloadFailed(
                f"cannot read the runtime's pid file {self.pid_file}: {err}; is it running?"
            ) from err
        if not text.isdigit() or int(text) <= 1 or int(text) == os.getpid():
            raise RuntimeReloadFailed(
                f"pid file {self.pid_file} holds {text[:32]!r}, not the PID of a runtime process"
            )
        return int(text)

    def _send_sighup(self) -> None:
        pid = self._read_pid()
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError as err:
            raise RuntimeReloadFailed(
                f"cannot signal the runtime (PID {pid} from {self.pid_file}): {err.strerror}; "
                "is the runtime running?"
            ) from err
        log.debug("runtime_signalled", pid=pid, signal="SIGHUP")

    async def _confirm(self) -> None:
        if self.confirm is None:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.confirm()
        except TimeoutError as err:
            raise RuntimeReloadFailed(
                f"the reload of {self.unit} was not confirmed within {self.timeout_s:g}s"
            ) from err


# ---------------------------------------------------------------- socket activation


def passed_listener(environ: Mapping[str, str], wanted: Address) -> socket.socket | None:
    """The listening socket systemd passed (sd_listen_fds(3), ``nodeagent-mirror.socket``),
    checked to be a listening TCP socket on exactly ``wanted``; None when none was passed
    (a run by hand: the caller binds). ``ConfigInvalid`` (exit 78) names what is wrong and
    what to do (decision 0063)."""
    from nodeagent.mirror.activation import (  # noqa: PLC0415  (the mirror process only)
        LISTEN_FDS_START,
        passed_fds,
        socket_problem,
    )

    passed = passed_fds(environ, os.getpid())
    if passed.problem:
        raise ConfigInvalid(_socket_advice(passed.problem, wanted))
    if not passed.count:
        return None
    fd = LISTEN_FDS_START
    try:
        os.set_inheritable(fd, False)
        found = socket.socket(fileno=fd)
    except OSError as err:
        raise ConfigInvalid(_socket_advice(f"descriptor {fd}: {err.strerror}", wanted)) from err
    problem = socket_problem(_facts(found), wanted)
    if problem:
        found.detach()  # systemd's socket stays as it is
        raise ConfigInvalid(_socket_advice(problem, wanted))
    found.setblocking(False)
    return found


def _facts(found: socket.socket) -> SocketFacts:
    from nodeagent.mirror.activation import SocketFacts  # noqa: PLC0415

    is_inet = found.family in (socket.AF_INET, socket.AF_INET6)
    try:
        is_listening = bool(found.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        name = found.getsockname() if is_inet else ("", 0)
    except OSError:
        return SocketFacts(is_inet, is_stream=False, is_listening=False, host="", port=0)
    return SocketFacts(
        is_inet,
        is_stream=found.type == socket.SOCK_STREAM,
        is_listening=is_listening,
        host=str(name[0]),
        port=int(name[1]),
    )


def _socket_advice(problem: str, wanted: Address) -> str:
    return (
        f"the node mirror cannot take the socket systemd passed: {clip(problem, 300)}; "
        f"make nodeagent-mirror.socket listen on exactly {wanted} ([mirror] listen) with "
        "`systemctl edit nodeagent-mirror.socket` (ListenStream=), then "
        "`systemctl restart nodeagent-mirror.socket`"
    )

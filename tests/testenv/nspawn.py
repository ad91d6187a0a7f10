"""Boot a root file system under a real systemd with ``systemd-nspawn``, and talk to it.

PID 1 of this machine is not systemd, so there is no machined to register with and no
unit to run the container in: nspawn runs with ``--register=no --keep-unit``, and
``machinectl``/``systemd-run -M`` cannot reach the container. Instead:

* **Readiness and the leader's PID** come from nspawn's own sd_notify messages. The
  container is started with ``NOTIFY_SOCKET`` pointing at a datagram socket of ours and
  ``--notify-ready=yes``: nspawn first sends ``X_NSPAWN_LEADER_PID=<pid>`` (the container's
  PID 1 as seen from here), then ``READY=1`` once the container's systemd has finished
  booting (``Startup finished``).
* **Commands** run with ``nsenter --target <leader> --all``: every namespace of the
  container (mount, PID, UTS, IPC, cgroup), so ``systemctl`` and ``journalctl`` find the
  container's manager and journal. Without ``--private-network`` the container shares this
  machine's network namespace: the registry on 127.0.0.1 is reachable from inside.
* **Live files** (``/run`` is a tmpfs inside) are reached as ``/proc/<leader>/root/...``,
  unix sockets included (CRI, the system bus).
* **Reboot**: ``systemctl reboot`` inside makes nspawn exit with status 133 (as
  systemd-nspawn@.service would restart it); ``reboot()`` boots the same root again.
  ``stop()`` powers it off (exit 0), or terminates nspawn by PID after a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from tests.testenv.waiting import log_tail

EXIT_REBOOT = 133
"""nspawn's exit status when the container asked for a reboot."""


class ContainerError(RuntimeError):
    """nspawn exited, or the container did not become ready in time."""


class Container:
    """One ``systemd-nspawn -b`` of ``root``; its log and notify socket live in ``workdir``."""

    def __init__(
        self,
        root: Path,
        workdir: Path,
        *,
        machine: str = "nodeagent-e2e",
        options: Sequence[str] = (),
        boot_timeout_s: float = 60.0,
    ) -> None:
        self.root = root
        self.workdir = workdir
        self.machine = machine
        self.options = list(options)
        self.boot_timeout_s = boot_timeout_s
        self.log_path = workdir / "nspawn.log"
        self.notify_path = workdir / "notify.sock"
        self.process: subprocess.Popen[bytes] | None = None
        self.leader: int | None = None
        self.boots = 0
        self.boot_seconds: list[float] = []
        self._log: IO[bytes] | None = None

    # ------------------------------------------------------------ lifecycle
    def command(self) -> list[str]:
        return [
            "systemd-nspawn",
            "--register=no",
            "--keep-unit",
            "--boot",
            f"--directory={self.root}",
            f"--machine={self.machine}",
            "--notify-ready=yes",
            "--console=pipe",
            "--resolv-conf=off",
            "--timezone=off",
            "--link-journal=no",
            *self.options,
        ]

    def boot(self) -> None:
        """Start nspawn and wait until the container's systemd has finished booting."""
        if self.process is not None:
            raise RuntimeError("container already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.notify_path.unlink(missing_ok=True)
        started = time.monotonic()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as notify:
            notify.bind(str(self.notify_path))
            self.boots += 1
            self._log = self.log_path.open("ab")
            self._log.write(f"----- boot {self.boots} -----\n".encode())
            self._log.flush()
            env = dict(os.environ, NOTIFY_SOCKET=str(self.notify_path))
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
            )
            try:
                self._await_ready(notify)
            except BaseException:
                self.kill()
                raise
        self.boot_seconds.append(time.monotonic() - started)

    def _await_ready(self, notify: socket.socket) -> None:
        deadline = time.monotonic() + self.boot_timeout_s
        is_ready = False
        while not (is_ready and self.leader is not None):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waited = f"{self.boot_timeout_s:g}s"
                raise ContainerError(f"container not ready in {waited}\n{self.tail()}")
            notify.settimeout(min(remaining, 0.5))
            try:
                message = notify.recv(4096).decode(errors="replace")
            except TimeoutError:
                self._raise_if_exited()
                continue
            fields = dict(line.partition("=")[::2] for line in message.splitlines())
            if fields.get("X_NSPAWN_LEADER_PID", "").isdigit():
                self.leader = int(fields["X_NSPAWN_LEADER_PID"])
            is_ready = is_ready or fields.get("READY") == "1"

    def _raise_if_exited(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            code = self.process.returncode
            self._reap()
            raise ContainerError(f"systemd-nspawn exited with {code}\n{self.tail()}")

    def wait_exit(self, timeout_s: float) -> int:
        """Wait for nspawn to exit (after a poweroff or reboot inside); its exit status."""
        assert self.process is not None, "container not running"
        try:
            code = self.process.wait(timeout=timeout_s)
        finally:
            if self.process.poll() is not None:
                self._reap()
        return code

    def reboot(self, timeout_s: float = 60.0) -> None:
        """``systemctl reboot`` inside, then boot the same root again (as nspawn@.service)."""
        self.run("systemctl", "reboot", check=False)
        code = self.wait_exit(timeout_s)
        if code != EXIT_REBOOT:
            raise ContainerError(f"nspawn exited with {code} after a reboot, not {EXIT_REBOOT}")
        self.boot()

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """Power the container off; SIGTERM then SIGKILL nspawn if it does not exit."""
        if self.process is None:
            return None
        process = self.process
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.run("systemctl", "poweroff", "--no-block", check=False, timeout_s=10)
        try:
            return self.wait_exit(timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # nspawn asks the container to shut down
            try:
                return self.wait_exit(timeout_s / 2)
            except subprocess.TimeoutExpired:
                self.kill()
                return None

    def kill(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=30)
            self._reap()

    def _reap(self) -> None:
        self.process = None
        self.leader = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self) -> str:
        return log_tail(self.log_path)

    def __enter__(self) -> Self:
        self.boot()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ inside
    def run(
        self, *cmd: str, check: bool = True, timeout_s: float = 60.0, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in every namespace of the container (as root)."""
        if self.leader is None:
            raise ContainerError("container not running")
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "SYSTEMD_PAGER": "",
            "SYSTEMD_COLORS": "0",
            "SYSTEMD_URLIFY": "0",
        }
        result = subprocess.run(
            ["nsenter", f"--target={self.leader}", "--all", "--", *cmd],
            capture_output=True,
            text=True,
            env=env,
            input=input_text,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise ContainerError(
                f"{' '.join(cmd)} exited with {result.returncode} in the container\n"
                f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
            )
        return result

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", "--no-pager", *args, check=check)

    def journal(self, *args: str) -> str:
        """``journalctl --no-pager`` output (``-q``: no "-- Boot --" lines)."""
        return self.run("journalctl", "--no-pager", "-q", *args).stdout

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        """``systemctl show`` properties of ``unit``."""
        out = self.systemctl("show", unit, *(f"--property={p}" for p in properties)).stdout
        return dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)

    def live(self, path: str) -> Path:
        """``path`` inside the running container, as this machine sees it."""
        if self.leader is None:
            raise ContainerError("container not running")
        return Path(f"/proc/{self.leader}/root") / path.lstrip("/")

"""A udev daemon confined to one site node, which runs the same beside a host's own udevd.

``NodeUdevd(workdir, host_prefix)`` is the site tests' stick: a systemd-udevd started in one
node's network namespace (``host_prefix``, ``ip netns exec <node>``), so only processes in
that namespace hear its events (udevd re-broadcasts on a netlink socket, and that socket
belongs to a network namespace). Its ``/run/udev`` (control socket, database, queue, rules)
is a tmpfs of its own, ``workdir/run-udev``, bind-mounted on ``/run/udev`` in the private
mount namespace that ``ip netns exec`` gives each command (``view_prefix``). The node
daemons that may have the stick run with the same bind, so they read its database;
``settle()`` and ``properties()`` ask it the same way.

Why a ``/run/udev`` of its own: on a systemd-booted machine a udevd already runs in the
host's namespaces and owns ``/run/udev``. Two daemons over one control socket and one
database would fight; over two, they do not. The kernel's events reach both: the host's
daemon processes the stick too, with the host's rules, as it does on a real node, and its
broadcasts stay in the host's network namespace, where no site node listens.

``host_rules(rules)`` is the other half of running beside a host's udevd: it installs a
rules file in the running daemon's ``/run/udev/rules.d`` for the length of a ``with`` and
makes it re-read its rules (the e2e node's packaged rule on such a host: udevd does not
run inside systemd-nspawn, the host's serves the container).

``HostUdevd(workdir)`` stands for a systemd host's daemon on a machine that runs none (this
project's CI): a systemd-udevd in the host's namespaces over a fresh tmpfs on
``/run/udev``, started the way the tests start nothing else, so ``udev.foreign_udevd_answers``
is true while it runs, exactly as on a developer's laptop.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tests.testenv.lifecycle import Service
from tests.testenv.packages import ensure_packages
from tests.testenv.udev import (
    MEDIA_PACKAGES,
    RUN_UDEV,
    SETTLE_TIMEOUT_S,
    UDEVD,
    UdevdStartError,
    _terminate,
    udevd_answers,
)
from tests.testenv.waiting import log_tail, wait_for

_ACTIVE: list[NodeUdevd] = []
"""The node udevd that runs now (at most one: one kernel, one stick at a time)."""


def active() -> NodeUdevd | None:
    """The running ``NodeUdevd``, if any: the nodes that may have the stick read its database."""
    return _ACTIVE[0] if _ACTIVE else None


def _mount_tmpfs(target: Path, name: str) -> None:
    cmd = ["mount", "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", name, str(target)]
    subprocess.run(cmd, check=True, capture_output=True)


class NodeUdevd(Service):
    """A udevd in one node's network namespace, over a ``/run/udev`` of its own."""

    def __init__(self, workdir: Path, host_prefix: Sequence[str]) -> None:
        self.workdir = workdir
        self.host_prefix = list(host_prefix)
        self.run_dir = workdir / "run-udev"
        self.log_path = workdir / "udevd.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._made_mount_point = False

    def view_prefix(self, host_prefix: Sequence[str]) -> list[str]:
        """Prepend to run a command in ``host_prefix``'s namespace over this daemon's
        ``/run/udev`` (a bind in the mount namespace of that command alone)."""
        bind = f'mount --bind {self.run_dir} {RUN_UDEV} && exec "$@"'
        return [*host_prefix, "sh", "-c", bind, "sh"]

    def start(self) -> None:
        if _ACTIVE:
            raise UdevdStartError("a node udevd runs already: one stick at a time")
        ensure_packages(MEDIA_PACKAGES)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not RUN_UDEV.exists():  # the bind needs a mount point; a systemd host has one
            RUN_UDEV.mkdir(mode=0o755)
            self._made_mount_point = True
        _mount_tmpfs(self.run_dir, "nodeagent-node-udev")
        self._log = self.log_path.open("wb")
        _ACTIVE.append(self)
        try:
            self._spawn()
        except BaseException:
            self.stop()
            raise

    def _spawn(self) -> None:
        self._process = subprocess.Popen(
            [*self.view_prefix(self.host_prefix), str(UDEVD), "--debug"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._is_up, timeout_s=20, what="the node's udevd to answer", detail=self.log_tail)
        if self._process.poll() is not None:
            raise UdevdStartError(f"systemd-udevd exited at start\n{self.log_tail()}")

    def _udevadm(self, *args: str, timeout_s: int = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.view_prefix(self.host_prefix), "udevadm", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
        )

    def _is_up(self) -> bool:
        assert self._process is not None
        if self._process.poll() is not None:
            return True
        return self._udevadm("control", "--ping", "--timeout=1").returncode == 0

    def move(self, host_prefix: Sequence[str]) -> None:
        """Stop the daemon and start it again in another node's namespace: from now on that
        node hears of media, and no other does. Its database is kept (the tmpfs stays)."""
        if self._process is None:
            raise UdevdStartError("the node udevd is not running")
        _terminate(self._process)
        self.host_prefix = list(host_prefix)
        self._spawn()

    def settle(self, timeout_s: int = SETTLE_TIMEOUT_S) -> None:
        """Wait until this daemon has processed every event queued so far."""
        done = self._udevadm("settle", f"--timeout={timeout_s}", timeout_s=timeout_s + 10)
        if done.returncode != 0:
            raise UdevdStartError(f"udevadm settle failed: {done.stderr.strip()}")

    def properties(self, devnode: str) -> dict[str, str]:
        """What this daemon's database holds for ``devnode`` now."""
        done = self._udevadm("info", "--query=property", f"--name={devnode}")
        pairs = (line.partition("=") for line in done.stdout.splitlines())
        return {key: value for key, _, value in pairs}

    def stop(self) -> None:
        if self._process is not None:
            _terminate(self._process)
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        subprocess.run(["umount", str(self.run_dir)], check=False, capture_output=True)
        if self._made_mount_point:
            RUN_UDEV.rmdir()
            self._made_mount_point = False
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def log_tail(self) -> str:
        return log_tail(self.log_path)


class HostUdevd(Service):
    """A stand-in for a systemd host's udevd: one in the host's namespaces over a fresh tmpfs
    on ``/run/udev``, which the tests' ``Udevd`` does not count as its own."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.log_path = workdir / "host-udevd.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._made_run_dir = False
        self._mounted = False

    def start(self) -> None:
        if udevd_answers():
            raise UdevdStartError("a udevd runs on this machine already: use it, start none")
        ensure_packages(MEDIA_PACKAGES)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not RUN_UDEV.exists():
            RUN_UDEV.mkdir(mode=0o755)
            self._made_run_dir = True
        _mount_tmpfs(RUN_UDEV, "nodeagent-host-udev")
        self._mounted = True
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            [str(UDEVD)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_up(self._process)
        except BaseException:
            self.stop()
            raise

    def _wait_up(self, process: subprocess.Popen[bytes]) -> None:
        wait_for(
            lambda: process.poll() is not None or udevd_answers(),
            timeout_s=20,
            what="the host's udevd to answer",
            detail=lambda: log_tail(self.log_path),
        )
        if process.poll() is not None:
            raise UdevdStartError(f"systemd-udevd exited\n{log_tail(self.log_path)}")

    def stop(self) -> None:
        if self._process is not None:
            _terminate(self._process)
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._mounted:
            subprocess.run(["umount", str(RUN_UDEV)], check=False, capture_output=True)
            self._mounted = False
        if self._made_run_dir:
            RUN_UDEV.rmdir()
            self._made_run_dir = False


@contextmanager
def host_rules(rules: Path) -> Iterator[Path]:
    """``rules`` installed in the running udevd's ``/run/udev/rules.d`` (a host's daemon, not
    one the tests started) and re-read; removed and re-read again on exit."""
    target = RUN_UDEV / "rules.d" / rules.name
    if target.exists():
        raise UdevdStartError(f"{target} exists already: not replacing the host's own file")
    target.parent.mkdir(exist_ok=True)
    shutil.copyfile(rules, target)
    try:
        subprocess.run(["udevadm", "control", "--reload"], check=True, capture_output=True)
        yield target
    finally:
        target.unlink(missing_ok=True)
        subprocess.run(["udevadm", "control", "--reload"], check=False, capture_output=True)

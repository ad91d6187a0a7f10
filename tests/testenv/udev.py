"""A real systemd-udevd and loop-device media for the udev and mount integration tests.

``Udevd(workdir)`` makes sure a udev daemon answers on ``/run/udev/control``:

* if one already answers (``udevadm control --ping``), it is used and left alone;
* otherwise Debian's ``/lib/systemd/systemd-udevd`` (package ``udev``, installed on
  demand) is started in the foreground as a child in its own session, with
  ``--debug`` and its output in ``workdir/udevd.log``, after a fresh tmpfs was
  mounted on ``/run/udev``: the daemon's database, watches and control socket
  live there and vanish with it. On a real host ``/run`` is a tmpfs; on this
  machine it is not, and udevd refuses to clean a non-tmpfs ``/run/udev``.
  ``stop()`` terminates the daemon by PID (SIGTERM, then SIGKILL), unmounts the
  tmpfs and removes ``/run/udev`` if it created it.

While it runs, the daemon processes every kernel event of the machine, as a
host's udevd would (symlinks under ``/dev/disk``, an inotify watch on block
devices). It does not coldplug: nothing is re-triggered at start. ``stop()``
also removes ``/dev/disk`` if it did not exist before: its links would go stale.

``LoopMedia.create(workdir, fs_type, label=..., files=...)`` builds a filesystem
image WITHOUT mounting anything (``mkfs.ext4 -d``, ``mksquashfs``, ``mkfs.erofs``,
``mkfs.btrfs --rootdir``; ``mkfs.xfs`` images are empty) and attaches it with
``losetup --find --show``; leaving the context detaches it and deletes the image.
Loop devices that already exist (loop0..7) report ``change`` on attach and detach,
never ``add``/``remove``; ``trigger_add()`` makes udev send ``add``.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from tests.testenv.lifecycle import Service
from tests.testenv.packages import ensure_packages
from tests.testenv.waiting import log_tail, wait_for

UDEVD = Path("/lib/systemd/systemd-udevd")
RUN_UDEV = Path("/run/udev")
DEV_DISK = Path("/dev/disk")  # udevd's symlink tree (by-label, by-uuid, by-diskseq, ...)

# Debian package -> a file it installs: udevd and the tools that make test media.
MEDIA_PACKAGES: dict[str, str] = {
    "udev": str(UDEVD),
    "mount": "/usr/sbin/losetup",
    "e2fsprogs": "/usr/sbin/mkfs.ext4",
    "xfsprogs": "/usr/sbin/mkfs.xfs",
    "squashfs-tools": "/usr/bin/mksquashfs",
    "erofs-utils": "/usr/bin/mkfs.erofs",
    "btrfs-progs": "/usr/sbin/mkfs.btrfs",
}

TEST_MEDIA_BUSES: frozenset[str] = frozenset({"usb", "loop"})
"""The buses a watcher or daemon under test takes media from: its sticks are loop devices,
which nodeagent's default (``usb`` only) refuses; tests name ``loop`` explicitly."""
TEST_MEDIA_CONFIG = 'media_buses = ["usb", "loop"]'
"""The ``[bundles]`` line that lets a daemon under test take loop-device sticks."""
TEST_SESSION_CONFIG = 'session_socket = ""'
"""The ``[bundles]`` line that makes a daemon under test start its mirror sessions' server
as its own child (no ``nodeagent-session.socket`` outside systemd; decision 0064). The e2e
node under systemd-nspawn keeps the default: the RPM's socket unit, unprivileged."""

SETTLE_TIMEOUT_S = 20
_SERIAL = itertools.count(1)
FileSpec = Mapping[str, tuple[bytes, int]]
"""Relative path -> (content, mode) of a file on test media."""


class UdevdStartError(RuntimeError):
    """systemd-udevd exited or did not answer its control socket in time."""


OWNED: set[int] = set()
"""The ``Udevd`` objects of this process whose daemon runs (by ``id``): a daemon that answers
while this is empty was not started by these tests."""


def foreign_udevd_answers() -> bool:
    """Whether a udev daemon these tests did not start answers (a systemd-booted host's)."""
    return not OWNED and udevd_answers()


def udevd_answers(timeout_s: int = 1) -> bool:
    """True if a udev daemon answers a ping on its control socket."""
    result = subprocess.run(
        ["udevadm", "control", "--ping", f"--timeout={timeout_s}"],
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


def free_loop_device() -> str:
    """``losetup --find``: the first unused loop device (created if needed), not attached yet."""
    result = subprocess.run(["losetup", "--find"], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def settle(timeout_s: int = SETTLE_TIMEOUT_S) -> None:
    """Wait until udevd has processed every event queued so far."""
    subprocess.run(["udevadm", "settle", f"--timeout={timeout_s}"], check=True)


def udev_properties(devnode: str) -> dict[str, str]:
    """What the udev database holds for ``devnode`` now."""
    result = subprocess.run(
        ["udevadm", "info", "--query=property", f"--name={devnode}"],
        capture_output=True,
        text=True,
        check=False,
    )
    pairs = (line.partition("=") for line in result.stdout.splitlines())
    return {key: value for key, _, value in pairs}


class Udevd(Service):
    """A running udev daemon for the tests: the machine's own, or one started here."""

    def __init__(self, workdir: Path, *, command_prefix: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.command_prefix = list(command_prefix)
        """Prepended to udevd's command: ``ip netns exec <node>`` starts it in a site node's
        network namespace, and then only processes in that namespace receive its events
        (udevd re-broadcasts on a netlink socket, which is per network namespace; the
        kernel's own events reach every namespace). ``/run/udev`` is mounted from here first,
        so its database is the same file system for everyone."""
        self.log_path = workdir / "udevd.log"
        self.is_owned = False
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._made_run_dir = False
        self._made_dev_disk = False

    def start(self) -> None:
        if udevd_answers():
            return
        ensure_packages(MEDIA_PACKAGES)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._made_dev_disk = not DEV_DISK.exists()
        self._mount_run_dir()
        self._log = self.log_path.open("wb")
        self.is_owned = True
        OWNED.add(id(self))
        self._spawn()

    def _spawn(self) -> None:
        self._process = subprocess.Popen(
            [*self.command_prefix, str(UDEVD), "--debug"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._is_up, timeout_s=20, what="systemd-udevd to answer", detail=self.log_tail)
        if self._process.poll() is not None:
            self.stop()
            raise UdevdStartError(f"systemd-udevd exited at start\n{log_tail(self.log_path)}")

    def move(self, command_prefix: Sequence[str]) -> None:
        """Stop the daemon and start it again under ``command_prefix`` (another site node's
        namespace: from now on that node hears of media, and no other does). ``/run/udev``
        stays mounted, its database kept: a daemon that started over it (in a private mount
        namespace, which a new tmpfs would not reach) keeps reading the live one."""
        if not self.is_owned or self._process is None:
            raise UdevdStartError("only a udevd the tests started can be moved")
        _terminate(self._process)
        self.command_prefix = list(command_prefix)
        self._spawn()

    def _is_up(self) -> bool:
        assert self._process is not None
        return self._process.poll() is not None or udevd_answers()

    def _mount_run_dir(self) -> None:
        if not RUN_UDEV.exists():
            RUN_UDEV.mkdir(mode=0o755)
            self._made_run_dir = True
        cmd = ["mount", "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "nodeagent-udev"]
        subprocess.run([*cmd, str(RUN_UDEV)], check=True, capture_output=True)

    def stop(self) -> None:
        if not self.is_owned:
            return
        self.is_owned = False
        OWNED.discard(id(self))
        if self._process is not None:
            _terminate(self._process)
        if self._log is not None:
            self._log.close()
        subprocess.run(["umount", str(RUN_UDEV)], check=False, capture_output=True)
        if self._made_run_dir:
            RUN_UDEV.rmdir()
        if self._made_dev_disk:  # only udev's symlinks, which no udev keeps right any more
            shutil.rmtree(DEV_DISK, ignore_errors=True)

    def log_tail(self) -> str:
        return log_tail(self.log_path) if self.is_owned else "(udevd not started by the tests)"

    def add_rules(self, rules: Path) -> Path:
        """Copy a rules file into ``/run/udev/rules.d`` (on this daemon's tmpfs: gone with it)
        and make the daemon re-read its rules. Only a daemon the tests started takes rules."""
        if not self.is_owned:
            raise UdevdStartError("the running udevd was not started by the tests: no rules added")
        target = RUN_UDEV / "rules.d" / rules.name
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(rules, target)
        subprocess.run(["udevadm", "control", "--reload"], check=True)
        return target


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


# ------------------------------------------------------------------ test media


def _stage(directory: Path, files: FileSpec) -> Path:
    directory.mkdir(parents=True)
    for name, (content, mode) in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    return directory


def _run(*cmd: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr}")


def make_image(image: Path, fs_type: str, *, label: str, files: FileSpec, size_mib: int) -> None:
    """A ``fs_type`` filesystem image holding ``files``; ``empty`` makes a zero-filled one."""
    with image.open("wb") as sparse:
        sparse.truncate(size_mib << 20)
    root = _stage(image.with_suffix(".d"), files)
    match fs_type:
        case "empty":
            pass
        case "ext4":
            _run("mkfs.ext4", "-q", "-F", "-L", label, "-d", str(root), str(image))
        case "btrfs":
            _run("mkfs.btrfs", "-q", "-f", "-L", label, "--rootdir", str(root), str(image))
        case "xfs":  # xfsprogs 6.1 cannot populate from a directory: empty filesystem
            _run("mkfs.xfs", "-q", "-f", "-L", label, str(image))
        case "squashfs":  # squashfs has no label
            _run("mksquashfs", str(root), str(image), "-noappend", "-quiet", "-all-root")
        case "erofs":  # erofs-utils 1.5 (Debian 12) cannot set a label
            _run("mkfs.erofs", "--quiet", "--all-root", str(image), str(root))
        case _:
            raise ValueError(f"no recipe for {fs_type} test media")


# Smallest sizes the tools accept here (sparse files: little real disk).
MIN_SIZE_MIB: dict[str, int] = {"xfs": 300, "btrfs": 128}


class LoopMedia:
    """A filesystem image on a loop device: removable media for tests."""

    def __init__(self, image: Path) -> None:
        self.image = image
        self.devnode: str | None = None

    @classmethod
    def create(
        cls,
        workdir: Path,
        fs_type: str,
        *,
        label: str = "",
        files: FileSpec | None = None,
        size_mib: int = 16,
    ) -> LoopMedia:
        """Build the image in ``workdir`` (not attached yet: call ``attach()``)."""
        ensure_packages(MEDIA_PACKAGES)
        workdir.mkdir(parents=True, exist_ok=True)
        image = workdir / f"{label or fs_type}-{next(_SERIAL)}.img"
        size = max(size_mib, MIN_SIZE_MIB.get(fs_type, 0))
        make_image(image, fs_type, label=label, files=files or {}, size_mib=size)
        return cls(image)

    def attach(self, devnode: str | None = None) -> str:
        """``losetup --find --show`` (or onto ``devnode``): the device node the image is now on."""
        where = [devnode] if devnode is not None else ["--find", "--show"]
        result = subprocess.run(
            ["losetup", *where, str(self.image)],
            capture_output=True,
            text=True,
            check=True,
        )
        self.devnode = devnode or result.stdout.strip()
        return self.devnode

    def detach(self) -> None:
        if self.devnode is not None:
            _run("losetup", "--detach", self.devnode)
            self.devnode = None

    def unplug(self) -> None:
        """What pulling the stick out does: udev reports its removal, a mount left behind is
        let go lazily, the device goes."""
        if self.devnode is None:
            return
        _run("udevadm", "trigger", "--action=remove", self.devnode)
        subprocess.run(["umount", "--lazy", self.devnode], check=False, capture_output=True)
        self.detach()

    def format(self, fs_type: str, *, label: str) -> None:
        """Make a new filesystem on the attached device (udev sees ``change``)."""
        assert self.devnode is not None, "attach() first"
        flag = {"ext4": "-F", "xfs": "-f", "btrfs": "-f"}[fs_type]
        _run(f"mkfs.{fs_type}", "-q", flag, "-L", label, self.devnode)

    def trigger_add(self) -> None:
        """``udevadm trigger --action=add``: udev sends an ``add`` for the device."""
        assert self.devnode is not None, "attach() first"
        _run("udevadm", "trigger", "--action=add", self.devnode)

    def wait_in_udev_db(self, key: str, value: str, *, timeout_s: float = 20) -> None:
        """Let udev process every event queued so far, then wait for ``key=value`` in its database.

        Attaching sends TWO ``change`` events; the database has the label after the
        first. ``udevadm settle`` makes sure the second is done too, so a watcher
        started afterwards sees neither.
        """
        devnode = self.devnode
        assert devnode is not None, "attach() first"
        settle()
        wait_for(
            lambda: udev_properties(devnode).get(key) == value,
            timeout_s=timeout_s,
            what=f"udev to record {key}={value} for {devnode}",
            detail=lambda: repr(udev_properties(devnode)),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.detach()
        self.image.unlink(missing_ok=True)

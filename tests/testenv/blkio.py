"""Reads from one block device slowed down for one process: a USB-stick-like medium.

Either cgroup version, whichever the machine mounts at ``/sys/fs/cgroup``:

* **v1** ``blkio``: a group of its own under ``/sys/fs/cgroup/blkio`` whose
  ``blkio.throttle.read_bps_device`` limits reads from the device;
* **v2** ``io``: a group of its own at the top of the unified hierarchy (the ``io``
  controller enabled in the root's ``cgroup.subtree_control``; a process may sit only in
  a leaf, which the new group is) whose ``io.max`` holds ``MAJ:MIN rbps=N``.

The process (every thread, and those it starts later) is moved into the group; leaving the
context moves it back to the group it came from (if it still runs) and removes the group.
Used where a test must act while the daemon copies a bundle from a loop device (the copy
otherwise takes well under a second). ``bench/store_copy.py`` throttles itself the same way.

This machine kind mounts v1 (docs/testing.md): the v2 path is tested against a fake
cgroupfs (tests/unit/testenv/test_blkio.py), not on a real v2 host here.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from tests.testenv.waiting import wait_for

CGROUP = Path("/sys/fs/cgroup")


def version(root: Path = CGROUP) -> int | None:
    """1 or 2: the cgroup version that offers a read throttle under ``root``; None: none."""
    if (root / "blkio" / "cgroup.procs").exists():
        return 1
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "io" in controllers.read_text().split():
        return 2
    return None


def missing(root: Path = CGROUP) -> str | None:
    """What keeps reads from being throttled here (None: nothing)."""
    if version(root) is None:
        return (
            f"no cgroup v1 blkio controller ({root}/blkio) and no cgroup v2 io controller "
            f"({root}/cgroup.controllers)"
        )
    return None


def is_available(root: Path = CGROUP) -> bool:
    return version(root) is not None


def device_number(devnode: str) -> str:
    """``major:minor`` of a block device node."""
    info = Path(devnode).stat()
    return f"{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"


def current_group(pid: int, proc: Path = Path("/proc")) -> str:
    """The v2 group of ``pid`` (``0::/path`` in /proc/PID/cgroup), ``/`` if none is listed."""
    for line in (proc / str(pid) / "cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return "/"


@contextlib.contextmanager
def throttled_reads(
    pid: int,
    devnode: str,
    bytes_per_s: int,
    *,
    root: Path = CGROUP,
    device: str | None = None,
    proc: Path = Path("/proc"),
) -> Iterator[None]:
    """Process ``pid`` reads at most ``bytes_per_s`` from ``devnode`` meanwhile
    (``device``: its ``major:minor``, read from ``devnode`` when not given)."""
    number = device or device_number(devnode)
    match version(root):
        case 1:
            with _v1(root / "blkio", pid, number, bytes_per_s):
                yield
        case 2:
            with _v2(root, pid, number, bytes_per_s, current_group(pid, proc)):
                yield
        case _:
            raise RuntimeError(missing(root))


@contextlib.contextmanager
def _v1(blkio: Path, pid: int, device: str, bytes_per_s: int) -> Iterator[None]:
    group = blkio / f"nodeagent-test-{os.getpid()}-{pid}"
    group.mkdir()
    try:
        (group / "blkio.throttle.read_bps_device").write_text(f"{device} {bytes_per_s}\n")
        (group / "cgroup.procs").write_text(f"{pid}\n")
        yield
    finally:
        _release(group, blkio / "cgroup.procs", pid)


@contextlib.contextmanager
def _v2(root: Path, pid: int, device: str, bytes_per_s: int, came_from: str) -> Iterator[None]:
    subtree = root / "cgroup.subtree_control"
    if "io" not in subtree.read_text().split():
        subtree.write_text("+io\n")
    group = root / f"nodeagent-test-{os.getpid()}-{pid}"
    group.mkdir()
    try:
        (group / "io.max").write_text(f"{device} rbps={bytes_per_s}\n")
        (group / "cgroup.procs").write_text(f"{pid}\n")
        yield
    finally:
        _release(group, root / came_from.lstrip("/") / "cgroup.procs", pid)


def _release(group: Path, back: Path, pid: int) -> None:
    """Move ``pid`` back, then whatever else is still in ``group`` (what the throttled
    process started meanwhile: an import's session process), then remove the group. A
    process on its way out keeps the group busy (EBUSY) for a moment: retried."""
    with contextlib.suppress(ProcessLookupError, OSError):
        back.write_text(f"{pid}\n")

    def removed() -> bool:
        with contextlib.suppress(OSError):  # gone with the group's files, or never there
            for other in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, OSError):
                    back.write_text(f"{other}\n")
        try:
            group.rmdir()
        except OSError as err:
            if err.errno != errno.EBUSY:
                raise
            return False
        return True

    wait_for(removed, timeout_s=10, interval_s=0.05, what=f"{group} emptied and removed")

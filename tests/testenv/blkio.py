"""Reads from one block device slowed down for one process: a USB-stick-like medium.

cgroup v1 ``blkio``: a group of its own under ``/sys/fs/cgroup/blkio`` whose
``blkio.throttle.read_bps_device`` limits reads from the device, and the process (every
thread, and those it starts later) moved into it. Leaving the context moves the process
back to the root group (if it still runs) and removes the group. Used where a test must
act while the daemon copies a bundle from a loop device (the copy otherwise takes well
under a second). ``bench/store_copy.py`` throttles itself the same way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")


def is_available() -> bool:
    """Whether this machine has the cgroup v1 blkio controller mounted."""
    return (BLKIO / "cgroup.procs").exists()


def device_number(devnode: str) -> str:
    """``major:minor`` of a block device node."""
    info = Path(devnode).stat()
    return f"{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"


@contextlib.contextmanager
def throttled_reads(pid: int, devnode: str, bytes_per_s: int) -> Iterator[None]:
    """Process ``pid`` reads at most ``bytes_per_s`` from ``devnode`` meanwhile."""
    group = BLKIO / f"nodeagent-test-{os.getpid()}-{pid}"
    group.mkdir()
    try:
        (group / "blkio.throttle.read_bps_device").write_text(
            f"{device_number(devnode)} {bytes_per_s}\n"
        )
        (group / "cgroup.procs").write_text(f"{pid}\n")
        yield
    finally:
        with contextlib.suppress(ProcessLookupError, OSError):
            (BLKIO / "cgroup.procs").write_text(f"{pid}\n")
        group.rmdir()

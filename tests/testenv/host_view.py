"""The test session's own view of ``/var/lib/containers``: nothing the peers write lands there.

containers/image, in CRI-O, skopeo and podman, keeps root's blob-info cache in
``/var/lib/containers/cache`` (``blob-info-cache-v1.sqlite``/``.boltdb``) whatever their
storage configuration says: CRI-O has no setting for it, skopeo no flag (source in
docs/runtime-facts.md, "containers/image's blob-info cache"). A test session that pulls
would write the host's. ``private_containers_dir(workdir)`` moves the test process into a
mount namespace of its own (``unshare(CLONE_NEWNS)``, mounts made private) with a tmpfs on
``/var/lib/containers``; every peer the tests start after that inherits it, so the cache
lives and dies with the session. Where ``/var/lib/containers`` did not exist, it is made
as a mount point first and removed at the end, in the host's namespace (the way
``tests/testenv/udev.py`` makes and removes ``/run/udev``).

It must run while the process has one thread (the kernel refuses ``CLONE_NEWNS`` to a
process whose threads share its file-system context): ``tests/conftest.py`` calls it when
collection is done, before the test environment is prepared.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

CONTAINERS_DIR = Path("/var/lib/containers")
CLONE_NEWNS = 0x00020000


class HostViewError(RuntimeError):
    """The session could not be given a view of its own (it then writes nothing either)."""


def _unshare_mounts() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        error = ctypes.get_errno()
        raise HostViewError(f"unshare(CLONE_NEWNS) failed: {os.strerror(error)}")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True, capture_output=True)


class PrivateContainersDir:
    """The session's tmpfs on ``/var/lib/containers``; ``close()`` removes a mount point it
    made, in the namespace it came from."""

    def __init__(self, host_ns: int, made_mount_point: bool) -> None:
        self._host_ns = host_ns
        self._made_mount_point = made_mount_point

    def host_prefix(self) -> list[str]:
        """Prepend to run a command in the mount namespace the session came from."""
        return ["nsenter", f"--mount=/proc/{os.getpid()}/fd/{self._host_ns}"]

    def close(self) -> None:
        if self._made_mount_point:
            rmdir = [*self.host_prefix(), "rmdir", str(CONTAINERS_DIR)]
            subprocess.run(rmdir, check=False, capture_output=True)
            self._made_mount_point = False
        os.close(self._host_ns)


def private_containers_dir() -> PrivateContainersDir:
    """Give this process (and every child from now on) a tmpfs on ``/var/lib/containers``."""
    made = not CONTAINERS_DIR.exists()
    if made:
        CONTAINERS_DIR.mkdir(mode=0o700, parents=True)
    host_ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    view = PrivateContainersDir(host_ns, made)
    try:
        _unshare_mounts()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "mode=0700,nosuid,nodev", "nodeagent-test-containers",
             str(CONTAINERS_DIR)],
            check=True, capture_output=True,
        )  # fmt: skip
    except (HostViewError, subprocess.CalledProcessError):
        view.close()
        raise
    return view


def is_private() -> bool:
    """Whether ``/var/lib/containers`` is the session's tmpfs in this process's view."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[0].split()[4] == str(CONTAINERS_DIR):
            return fields[1].split()[1] == "nodeagent-test-containers"
    return False


@contextlib.contextmanager
def own_containers_dir() -> Iterator[None]:
    """For a benchmark's ``main`` (``bench/``): the run and every peer it starts get a
    ``/var/lib/containers`` of their own, as a test session does, unless this process has
    that view already (a benchmark called from a test)."""
    if is_private():
        yield
        return
    view = private_containers_dir()
    try:
        yield
    finally:
        view.close()

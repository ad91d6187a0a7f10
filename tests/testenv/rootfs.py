"""A Debian root file system for booting under systemd-nspawn, cached as a tarball.

``rootfs_tarball()`` runs ``debootstrap --variant=minbase`` from Debian's archive once per
(suite, package list) and keeps the result as
``~/.cache/nodeagent-testenv/rootfs-<suite>-<key>.tar.zst``; ``unpack(target)`` extracts it
(about 2 s). The packages are what a node needs around nodeagent: systemd with D-Bus,
Python 3.11, and conmon and crun for CRI-O (whose binary the test environment builds and
binds in). Nothing is configured here: ``tests/testenv/node.py`` turns an unpacked root into
a node.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from tests.testenv.crio_build import CACHE_ROOT
from tests.testenv.packages import ensure_packages

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
ROOTFS_PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "libudev1",  # pyudev loads it with ctypes
    "python3",
    "conmon",
    "crun",
    "mount",
    "procps",  # /bin/kill: crio.service's ExecReload
    "rpm",  # rpm -U / rpm -e of nodeagent's package on the booted node
)

# Debian package -> a file it installs: what building and booting the root needs on the host.
HOST_PACKAGES: dict[str, str] = {
    "debootstrap": "/usr/sbin/debootstrap",
    "systemd-container": "/usr/bin/systemd-nspawn",
    "zstd": "/usr/bin/zstd",
    "rpm": "/usr/bin/rpmbuild",  # rpmbuild, rpm -i --root
}


def cache_key(suite: str = SUITE, packages: tuple[str, ...] = ROOTFS_PACKAGES) -> str:
    text = "\n".join([suite, MIRROR, "minbase", *sorted(packages)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def tarball_path(suite: str = SUITE, packages: tuple[str, ...] = ROOTFS_PACKAGES) -> Path:
    return CACHE_ROOT / f"rootfs-{suite}-{cache_key(suite, packages)}.tar.zst"


def rootfs_tarball(suite: str = SUITE, packages: tuple[str, ...] = ROOTFS_PACKAGES) -> Path:
    """The cached tarball, made with debootstrap on the first call (about 2 minutes)."""
    tarball = tarball_path(suite, packages)
    if tarball.exists():
        return tarball
    ensure_packages(HOST_PACKAGES)
    work = tarball.with_suffix(".partial.d")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    root = work / "root"
    log = work / "debootstrap.log"
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}"]
    with log.open("wb") as out:
        result = subprocess.run(
            [*cmd, suite, str(root), MIRROR], stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if result.returncode != 0:
        raise RuntimeError(f"debootstrap failed ({result.returncode}):\n{log.read_text()[-4000:]}")
    partial = work / "rootfs.tar.zst"
    tar = ["tar", "-C", str(root), "--numeric-owner", "--xattrs", "--zstd", "-cf"]
    subprocess.run([*tar, str(partial), "."], check=True)
    partial.rename(tarball)
    shutil.rmtree(work, ignore_errors=True)
    return tarball


def unpack(target: Path, tarball: Path | None = None) -> Path:
    """Extract the root file system into ``target`` (created); return ``target``."""
    source = tarball or rootfs_tarball()
    target.mkdir(parents=True, exist_ok=True)
    tar = ["tar", "-C", str(target), "--numeric-owner", "--xattrs", "--zstd", "-xf"]
    subprocess.run([*tar, str(source)], check=True)
    return target

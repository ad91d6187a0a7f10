"""Mount bundle media read-only with the mount(2) and umount2(2) syscalls (ctypes on libc).

No ``mount`` command, no libmount: the options are nodeagent's own
(``nodeagent.bundles.media.mount_options``), the generic ones become ``MS_*`` flags and
the rest (``noload``, ``norecovery``, ...) the filesystem's data string.
After mounting, statvfs must report read-only, nosuid, nodev and noexec, or the
mount is undone and refused.

Mount points live under a runtime directory from configuration
(``bundles.media_dir``, default ``/run/nodeagent/media``); a directory this module
creates gets mode 0700, so only root can walk into the media. It never mounts
over a non-empty directory or an existing mount point, and removes the mount
point it created when unmounting.

The calls block (a slow stick may take a second to mount): call them from a
thread (``asyncio.to_thread``). They need CAP_SYS_ADMIN in the initial mount
namespace (or the namespace the importer reads from).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import structlog

from nodeagent.bundles.media import mount_options, writable_mount_options
from nodeagent.errors import MediaMountFailed as MediaMountFailed
from nodeagent.errors import MediaUnmountFailed as MediaUnmountFailed

log = structlog.get_logger(__name__)

MS_RDONLY: Final = 1
MS_NOSUID: Final = 2
MS_NODEV: Final = 4
MS_NOEXEC: Final = 8
MNT_DETACH: Final = 2

_FLAG_BITS: Final = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
_REQUIRED_STATVFS: Final = os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC
_WRITABLE_STATVFS: Final = os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC
_DIR_MODE: Final = 0o700

_MOUNT_HINTS: Final = {
    errno.EPERM: "nodeagent needs CAP_SYS_ADMIN and a system call filter that allows @mount",
    errno.EACCES: "the device cannot be opened; is it blocked for this service (DeviceAllow=)?",
    errno.ENOENT: "the device node is gone: was the media pulled out?",
    errno.ENXIO: "the device has no media: was it pulled out?",
    errno.ENODEV: "the kernel has no driver for this filesystem type",
    errno.ENOTBLK: "this is not a block device",
    errno.EINVAL: "the device holds no valid filesystem of this type, or an option was refused",
    errno.EBUSY: "the device is in use (mounted elsewhere or opened exclusively)",
}


def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return lib


_LIBC: Final = _libc()


def split_options(options: str) -> tuple[int, str]:
    """``"ro,nosuid,noload"`` -> (MS_RDONLY | MS_NOSUID, ``"noload"``)."""
    flags, data = 0, []
    for option in filter(None, options.split(",")):
        if option in _FLAG_BITS:
            flags |= _FLAG_BITS[option]
        else:
            data.append(option)
    return flags, ",".join(data)


@dataclass(frozen=True, slots=True)
class Mount:
    """A read-only mount of bundle media; a context manager that unmounts on exit."""

    devnode: str
    fs_type: str
    target: Path
    options: str

    def unmount(self, *, lazy: bool = False) -> None:
        unmount(self.target, lazy=lazy)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.unmount()
        except MediaUnmountFailed as err:
            log.warning("media_unmount_deferred", target=str(self.target), error=err.message)
            self.unmount(lazy=True)


def mount_readonly(devnode: str, fs_type: str, target_dir: Path) -> Mount:
    """Mount ``devnode`` (a ``fs_type`` filesystem) read-only on ``target_dir``.

    ``target_dir`` is created (0700, as is its parent) when missing; an existing
    one must be an empty directory that is not a mount point.
    """
    options = mount_options(fs_type)
    is_created = _prepare_target(target_dir)
    try:
        _mount(devnode, target_dir, fs_type, options)
        _check_flags(target_dir)
    except MediaMountFailed:
        if is_created:
            target_dir.rmdir()
        raise
    log.info("media_mounted", devnode=devnode, target=str(target_dir), options=options)
    return Mount(devnode=devnode, fs_type=fs_type, target=target_dir, options=options)


def mount_for_writing(devnode: str, fs_type: str, target_dir: Path) -> Mount:
    """Mount ``devnode`` read-write but nosuid, nodev and noexec on ``target_dir``
    (``support-dump --to-stick`` only, decision 0072; bundle media are never mounted so)."""
    options = writable_mount_options(fs_type)
    is_created = _prepare_target(target_dir)
    try:
        _mount(devnode, target_dir, fs_type, options)
        _check_flags(target_dir, required=_WRITABLE_STATVFS)
    except MediaMountFailed:
        if is_created:
            target_dir.rmdir()
        raise
    log.info("media_mounted", devnode=devnode, target=str(target_dir), options=options)
    return Mount(devnode=devnode, fs_type=fs_type, target=target_dir, options=options)


def unmount(target: Path, *, lazy: bool = False) -> None:
    """Unmount ``target`` (``lazy``: detach now, finish when the last file closes), remove it.

    Unmounting what is not mounted is not an error; the directory is removed either way.
    """
    if _LIBC.umount2(os.fsencode(target), MNT_DETACH if lazy else 0) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # not mounted, or gone
            raise MediaUnmountFailed(_unmount_message(target, code))
    else:
        log.info("media_unmounted", target=str(target), is_lazy=lazy)
    try:
        target.rmdir()
    except FileNotFoundError:
        pass
    except OSError as err:
        raise MediaUnmountFailed(f"cannot remove mount point {target}: {err.strerror}") from err


def _unmount_message(target: Path, code: int) -> str:
    text = f"cannot unmount {target}: {os.strerror(code)}"
    if code == errno.EBUSY:
        return f"{text}; files on the media are still open: close them, or unmount lazily"
    return text


def _mount(devnode: str, target: Path, fs_type: str, options: str) -> None:
    flags, data = split_options(options)
    source, where = os.fsencode(devnode), os.fsencode(target)
    if _LIBC.mount(source, where, fs_type.encode(), flags, data.encode() or None) != 0:
        code = ctypes.get_errno()
        hint = _MOUNT_HINTS.get(code, "see the kernel log (dmesg) for the filesystem's reason")
        raise MediaMountFailed(
            f"cannot mount {devnode} ({fs_type}, {options}) on {target}: "
            f"{os.strerror(code)}; {hint}"
        )


def _check_flags(target: Path, *, required: int = _REQUIRED_STATVFS) -> None:
    """Undo and refuse a mount without the ``required`` flags (default: read-only, nosuid,
    nodev and noexec)."""
    missing = required & ~os.statvfs(target).f_flag
    if missing:
        _LIBC.umount2(os.fsencode(target), MNT_DETACH)
        raise MediaMountFailed(
            f"the kernel mounted {target} without the flags 0x{missing:x} "
            "(read-only, nosuid, nodev, noexec); refusing to use it"
        )


def _prepare_target(target: Path) -> bool:
    """Make sure ``target`` is an empty directory and no mount point; True if created here."""
    try:
        _make_private_dir(target.parent)
        target.mkdir(mode=_DIR_MODE)
    except FileExistsError:
        _check_reusable(target)
        return False
    except OSError as err:
        raise MediaMountFailed(f"cannot create mount point {target}: {err.strerror}") from err
    target.chmod(_DIR_MODE)  # whatever the umask
    return True


def _make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing ancestors) if missing; ``path`` itself gets mode 0700."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=_DIR_MODE)
    except FileExistsError:  # made meanwhile by someone else: theirs to keep
        return
    path.chmod(_DIR_MODE)


def _check_reusable(target: Path) -> None:
    info = os.lstat(target)
    if not stat.S_ISDIR(info.st_mode):
        raise MediaMountFailed(f"mount point {target} exists and is not a directory")
    if os.path.ismount(target):
        raise MediaMountFailed(f"{target} is already a mount point; unmount it first")
    if any(target.iterdir()):
        raise MediaMountFailed(f"mount point {target} is not empty; refusing to mount over it")

"""``bundle import DEVICE | LABEL=NAME``: the stick mounted by the command itself, read-only.

A by-hand import (``--allow-rollback``, ``--ignore-target``: what the daemon never does on
its own) used to need a ``mount -o ro`` first that no document named. Given a block device
(``/dev/sdb1``) or ``LABEL=NAME`` (udev's ``/dev/disk/by-label/NAME``, as mount(8) reads
it), the command mounts it the way the daemon does (``adapters.bundles.mount``: read-only,
nosuid, nodev, noexec, the filesystem's own no-replay options) on a private directory under
``[bundles] media_dir``, imports, and unmounts, whatever the import's outcome. An unmount
that fails is said (``MediaUnmountFailed``) and the mount is detached lazily, never left
silently. The filesystem type is udev's (``ID_FS_TYPE``), and must be one ``[bundles]
media_fs_types`` allows (decision 0073).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from nodeagent.cli import output
from nodeagent.config import Config
from nodeagent.errors import MediaMountFailed, MediaUnmountFailed
from nodeagent.strict import clip

BY_LABEL: Final = Path("/dev/disk/by-label")
_LABEL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
"""A label nodeagent's media carry (``NODEAGENT*``); udev escapes anything else."""


def device_of(given: str, *, by_label: Path = BY_LABEL) -> str | None:
    """The block device ``given`` names (a device node, or ``LABEL=NAME``); None: a
    directory (or anything else: the import says what it is)."""
    if given.startswith("LABEL="):
        label = given.removeprefix("LABEL=")
        if not _LABEL.fullmatch(label):
            raise MediaMountFailed(
                f"{clip(given, 80)}: a label is 1 to 64 of A-Z a-z 0-9 . _ + -, starting with "
                "a letter or digit"
            )
        link = by_label / label
        if not link.exists():
            raise MediaMountFailed(
                f"no medium labelled {label} is plugged in ({link} does not exist); labels "
                "match case and all"
            )
        return os.path.realpath(link)
    try:
        return given if stat.S_ISBLK(Path(given).stat().st_mode) else None
    except OSError:
        return None


@contextmanager
def mounted(config: Config, devnode: str) -> Iterator[Path]:
    """``devnode`` mounted read-only for the time of the block; unmounted after, even when
    the block raises. An unmount that fails is detached lazily and raised as
    ``MediaUnmountFailed`` after the block (printed as an ``error:`` line instead when the
    block raised, so neither error is lost)."""
    from nodeagent.adapters.bundles import mount as media_mount  # noqa: PLC0415
    from nodeagent.adapters.bundles.udev import filesystem_of  # noqa: PLC0415

    fs_type, _label = filesystem_of(devnode)
    allowed = config.bundles.media_fs_types
    if fs_type not in allowed:
        raise MediaMountFailed(
            f"{devnode} holds {clip(fs_type, 32) or 'no filesystem udev knows'}, not one of "
            f"{', '.join(allowed)} ([bundles] media_fs_types)"
        )
    target = config.bundles.media_dir / f"by-hand-{os.getpid()}"
    mount = media_mount.mount_readonly(devnode, fs_type, target)
    try:
        yield mount.target
    except BaseException:
        failed = _unmount(mount.target, media_mount.unmount)
        if failed is not None:
            output.print_error(failed.reason, failed.message)
        raise
    failed = _unmount(mount.target, media_mount.unmount)
    if failed is not None:
        raise failed


def _unmount(target: Path, unmount: Callable[..., None]) -> MediaUnmountFailed | None:
    try:
        unmount(target)
    except MediaUnmountFailed as err:
        unmount(target, lazy=True)  # detached now, released when the last file closes
        return MediaUnmountFailed(f"{err.message}; it was detached lazily instead")
    return None

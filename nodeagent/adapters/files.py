"""Files on the host: atomic writes, atomic symlinks, drop-in listing, free space, JSON state.

Every write goes through a temporary file in the target's own directory
(same filesystem, so the final ``rename`` is atomic), is fsynced, renamed over
the target, and the directory is fsynced so the rename itself survives a crash.
Unchanged bytes are not rewritten: the inode and mtime stay, and callers learn
from the ``False`` return that nothing needs reloading.

Temporary names are ``.<name>.<random>.tmp``. CRI-O reads every regular file in
its drop-in directory whatever the name, so a temporary file left behind by a
crash would be read as a drop-in: ``write_atomic`` and ``ensure_symlink``
remove stale temporaries of the same target before they create a new one.

Every ``OSError`` becomes ``HostFileError`` (``raise ... from``) naming the
path and what to check.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from nodeagent.errors import HostFileError, StateFileDamaged
from nodeagent.strict import MalformedInput, clip, loads_json

DIR_MODE: Final = 0o755
"""Mode of directories ``write_atomic`` creates (before the umask)."""
STORE_FILE_MODE: Final = 0o640
"""Mode of the store's files: root writes them, the peer server's group
(``nodeagent-peer``, inherited from the store's set-group-ID directory) reads them, no one
else does (registry sets are pulled with the node's pull secret; decision 0056)."""
STORE_DIR_MODE: Final = 0o750
"""Mode of the store's directories (before the umask; set-group-ID inherited)."""

_TMP_SUFFIX: Final = ".tmp"

DAMAGED_SUFFIX: Final = ".damaged-"
"""Set-aside copies are ``<name>.damaged-<UTC time>``, next to the file they replace."""
DAMAGED_KEPT: Final = 3
"""Set-aside copies kept per file (the newest): a file damaged over and over cannot fill the
state directory."""

JsonObject = dict[str, Any]
"""A decoded JSON object, as ``json.loads`` returns it."""


@dataclass(frozen=True)
class DiskFigures:
    """Space on the filesystem holding a path, from ``statvfs``."""

    total_bytes: int
    """Size of the filesystem (``f_blocks * f_frsize``)."""
    free_bytes: int
    """Free space including the root-reserved blocks (``f_bfree * f_frsize``)."""
    available_bytes: int
    """Free space outside the root reserve (``f_bavail * f_frsize``): what admission counts."""


def _fail(action: str, path: Path, err: OSError, hint: str) -> HostFileError:
    reason = err.strerror or type(err).__name__
    return HostFileError(f"cannot {action} {path}: {reason}; {hint}")


def _tmp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}{_TMP_SUFFIX}")


def _remove_stale_tmps(target: Path) -> None:
    """Remove temporaries a crashed earlier write of ``target`` left behind."""
    prefix, parent = f".{target.name}.", target.parent
    for entry in os.scandir(parent):
        if entry.name.startswith(prefix) and entry.name.endswith(_TMP_SUFFIX):
            (parent / entry.name).unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except (FileNotFoundError, NotADirectoryError):
        return False


def _write_tmp(tmp: Path, data: bytes, mode: int) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)  # fchmod ignores the umask; os.open's mode does not
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> bool:
    """Make ``path`` hold exactly ``data`` with ``mode``; return False if it already held it.

    Only the bytes are compared: a file with the right bytes and another mode
    is left alone. A symlink at ``path`` is replaced by a regular file. The
    parent directory is created (``DIR_MODE``) when missing.
    """
    try:
        if _holds(path, data):
            return False
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        _remove_stale_tmps(path)
        tmp = _tmp_name(path)
        try:
            _write_tmp(tmp, data, mode)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)
    except OSError as err:
        hint = f"check that {path.parent} is writable and its filesystem has space"
        raise _fail("write", path, err, hint) from err
    return True


def write_new(path: Path, data: bytes, *, mode: int) -> None:
    """Create ``path`` holding ``data`` with ``mode``, never over an existing file or link
    (``O_EXCL``): a secret key is never overwritten by accident. The parent directory is
    created (0700 when missing: it may hold a secret key)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_tmp(path, data, mode)
        _fsync_dir(path.parent)
    except FileExistsError as err:
        raise HostFileError(
            f"{path} already exists; nodeagent never overwrites a key: choose another --name "
            "or directory, or remove the old file yourself"
        ) from err
    except OSError as err:
        hint = f"check that {path.parent} is writable and its filesystem has space"
        raise _fail("write", path, err, hint) from err


def ensure_symlink(link: Path, target: Path) -> bool:
    """Make ``link`` a symlink to ``target`` (replacing atomically); False if it already was.

    ``target`` is stored as given; a relative target is resolved from
    ``link``'s directory, as the kernel does. Refuses a target that does not
    exist: a dangling entry in CRI-O's drop-in directory fails its whole
    configuration load (CRI-O will not start, a reload fails), so the caller
    writes the target first.
    """
    resolved = target if target.is_absolute() else link.parent / target
    if not resolved.exists():
        raise HostFileError(
            f"refusing to link {link} to {target}: the target does not exist and a dangling "
            "link would break CRI-O's configuration load; create the target first"
        )
    try:
        if link.is_symlink() and link.readlink() == target:
            return False
        _remove_stale_tmps(link)
        tmp = _tmp_name(link)
        tmp.symlink_to(target)
        try:
            tmp.replace(link)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(link.parent)
    except OSError as err:
        hint = f"check that {link.parent} exists, is writable and {link} is not a directory"
        raise _fail("link", link, err, hint) from err
    return True


def remove_file(path: Path) -> bool:
    """Remove ``path`` (a file or a symlink); return False if it was already gone."""
    try:
        path.unlink()
        _fsync_dir(path.parent)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise _fail("remove", path, err, f"check that {path.parent} is writable") from err
    return True


def mirror_directory(directory: Path, files: dict[str, bytes], *, suffix: str) -> list[str]:
    """Make the ``*<suffix>`` files of ``directory`` exactly ``files`` (name -> bytes).

    Each file is written atomically and only when its bytes differ; files with the suffix
    that are not in ``files`` are removed; other names are left alone. Returns the names
    written or removed, sorted.
    """
    directory.mkdir(parents=True, exist_ok=True)
    changed = [name for name, data in sorted(files.items()) if write_atomic(directory / name, data)]
    for entry in sorted(directory.iterdir()):
        name = entry.name
        if name.endswith(suffix) and not name.startswith(".") and name not in files:
            remove_file(entry)
            changed.append(name)
    return sorted(changed)


def set_aside(path: Path, *, now: dt.datetime | None = None) -> Path | None:
    """Rename ``path`` (a file or a directory) to ``<name>.damaged-<UTC time>`` beside it.

    Returns the new path, or None when ``path`` does not exist. Only the newest
    ``DAMAGED_KEPT`` set-aside copies of the same name are kept.
    """
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}")
    try:
        if not path.exists() and not path.is_symlink():
            return None
        serial = 1
        while target.exists() or target.is_symlink():
            serial += 1
            target = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}-{serial}")
        path.rename(target)
        _fsync_dir(path.parent)
        _prune_damaged(path)
    except OSError as err:
        raise _fail("move aside", path, err, f"check that {path.parent} is writable") from err
    return target


def _prune_damaged(path: Path) -> None:
    """Remove all but the newest ``DAMAGED_KEPT`` set-aside copies (newest by their name's
    time stamp, then serial)."""
    prefix = f"{path.name}{DAMAGED_SUFFIX}"

    def age(entry: Path) -> tuple[str, int]:
        stamp, _, serial = entry.name.removeprefix(prefix).partition("-")
        return stamp, int(serial) if serial.isdigit() else 1

    copies = sorted((e for e in path.parent.iterdir() if e.name.startswith(prefix)), key=age)
    for old in copies[:-DAMAGED_KEPT]:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def read_bytes_bounded(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of ``path``, no link followed (None when absent); a file larger than
    ``max_bytes`` is a ``HostFileError``, never read whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _fail("read", path, err, "check the file's type and permissions") from err
    with os.fdopen(fd, "rb") as stream:
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise HostFileError(f"cannot read {path}: more than {max_bytes} bytes")
    return data


def read_text_or_none(path: Path) -> str | None:
    """The UTF-8 text of ``path``, or None if it (or a symlink's target) does not exist."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _fail("read", path, err, "check the file's type and permissions") from err
    except UnicodeDecodeError as err:
        raise HostFileError(f"cannot read {path}: not UTF-8 text ({err.reason})") from err


def _walk_key(root: Path, path: Path) -> tuple[bytes, ...]:
    return tuple(os.fsencode(part) for part in path.relative_to(root).parts)


def _entries(directory: Path, *, recursive: bool) -> list[Path]:
    found: list[Path] = []
    for entry in os.scandir(directory):
        path = directory / entry.name
        if not entry.is_dir(follow_symlinks=False):
            found.append(path)
        elif recursive:
            found.extend(_entries(path, recursive=True))
    return found


def list_files(directory: Path, *, recursive: bool) -> list[Path]:
    """Every entry of ``directory`` that CRI-O would read as a drop-in, in CRI-O's order.

    Selection, as CRI-O's ``filepath.Walk`` (``lstat``) does: every entry that
    is not a directory, so symlinks are listed whatever they point to (CRI-O
    reads them through; a dangling one, or one to a directory, makes its
    configuration load fail, which the caller can detect by reading the entry).
    Symlinked directories are not descended into. A missing directory lists
    as empty, as CRI-O skips it.

    Order: ``filepath.Walk`` visits a directory's entries sorted bytewise by
    name and descends into a subdirectory at that subdirectory's place. That
    is the order of the tuple of path components compared bytewise, NOT the
    lexical order of the full path string: ``a/x`` comes before ``a-b`` and
    ``a.conf`` because the walk reaches ``a`` first, while as strings ``/``
    sorts after ``-`` and ``.``. The last file in this order wins for lists
    such as ``pinned_images``.
    """
    if not directory.exists():
        return []
    try:
        found = _entries(directory, recursive=recursive)
    except OSError as err:
        hint = "check that it is a readable directory (retry if it was changing)"
        raise _fail("list", directory, err, hint) from err
    return sorted(found, key=lambda path: _walk_key(directory, path))


def statvfs_free(path: Path) -> DiskFigures:
    """Size and free space of the filesystem holding ``path``.

    ``available_bytes`` leaves out the root-reserved blocks. nodeagent and
    CRI-O both write as root and could use that reserve, but it exists so the
    system keeps working when the disk is nearly full: admission counts
    ``available_bytes`` to keep it intact.
    """
    try:
        figures = os.statvfs(path)
    except OSError as err:
        raise _fail("measure free space of", path, err, "check that the path exists") from err
    return DiskFigures(
        total_bytes=figures.f_blocks * figures.f_frsize,
        free_bytes=figures.f_bfree * figures.f_frsize,
        available_bytes=figures.f_bavail * figures.f_frsize,
    )


MAX_STATE_FILE_BYTES: Final = 64 * 1024 * 1024
"""A state file larger than this is damaged, unread. The largest, the ledger, holds ~150 bytes
per pinned image: 64 MiB is ~400,000 images, far beyond any node's sets."""

_REBUILT = (
    "; the daemon sets it aside and rebuilds it by itself (if it stays, remove it and "
    "restart nodeagent)"
)


class JsonStateStore:
    """Named JSON documents in one directory, written atomically as canonical JSON.

    Canonical means sorted keys, two-space indent, UTF-8, trailing newline: the
    same state gives the same bytes, so an unchanged save does not touch the file.
    Files are ``<name>.json`` with mode 0600 (state may name registries and nodes).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, name: str) -> Path:
        if not name or name.startswith(".") or "/" in name or "\0" in name:
            raise ValueError(f"invalid state name {name!r}: use a plain file name")
        return self.directory / f"{name}.json"

    def load(self, name: str) -> JsonObject | None:
        """The stored object, or None if it was never saved.

        Raises ``StateFileDamaged`` when the file cannot be decoded (not UTF-8, not strict
        JSON: duplicate keys, NaN, nesting over 32, over ``MAX_STATE_FILE_BYTES``; not an
        object, a directory in its place): the caller sets it aside
        (``set_aside``) and rebuilds. Other ``HostFileError``s are I/O failures.
        """
        path = self._path(name)
        try:
            with path.open("rb") as stream:
                data = stream.read(MAX_STATE_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except IsADirectoryError as err:
            raise StateFileDamaged(f"state file {path} is a directory{_REBUILT}") from err
        except OSError as err:
            raise _fail("read", path, err, "check the file's type and permissions") from err
        try:
            value = loads_json(
                data, what=f"state file {clip(path)}", max_bytes=MAX_STATE_FILE_BYTES, max_depth=32
            )
        except MalformedInput as err:
            raise StateFileDamaged(f"{err}{_REBUILT}") from err
        if not isinstance(value, dict):
            raise StateFileDamaged(
                f"state file {path} holds a {type(value).__name__}, not an object{_REBUILT}"
            )
        return value

    def set_aside(self, name: str) -> str | None:
        """Move a damaged ``<name>.json`` aside (``set_aside``); the path it went to, or None."""
        moved = set_aside(self._path(name))
        return None if moved is None else str(moved)

    def save(self, name: str, obj: JsonObject) -> bool:
        """Store ``obj``; return False if the stored bytes were already the same."""
        text = json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
        return write_atomic(self._path(name), (text + "\n").encode(), mode=0o600)

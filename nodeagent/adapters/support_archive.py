"""The support archive's I/O: a bounded journal excerpt, and the tar.gz written atomically.

``journal_excerpt`` runs ``journalctl -u <unit>`` (``asyncio.subprocess``, a fixed argv)
for the newest lines (bounded in lines, bytes and time; a journal that cannot be read is
a reason, never an empty excerpt taken for "nothing happened"). ``write_archive`` writes
the members into a temporary file beside the target (mode 0600 from its creation,
``O_EXCL``), fsyncs it, links it into place (renames it on a filesystem without links)
and fsyncs the directory: a reader sees the whole archive or none. It never replaces a
file.
"""

from __future__ import annotations

import asyncio
import errno
import io
import os
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nodeagent.errors import HostFileError

PIPE: Final = asyncio.subprocess.PIPE

JOURNAL_LINES: Final = 20000
JOURNAL_TIMEOUT_S: Final = 30.0
ARCHIVE_MODE: Final = 0o600


@dataclass(frozen=True, slots=True)
class Excerpt:
    text: str
    problem: str = ""
    """Why there is no excerpt (journalctl missing, failed, timed out); "" when read."""


async def journal_excerpt(unit: str, max_bytes: int, *, lines: int = JOURNAL_LINES) -> Excerpt:
    """The newest ``lines`` lines of ``unit``'s journal, at most ``max_bytes`` (the newest
    kept), as text (undecodable bytes replaced)."""
    cmd = ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-q", "-o", "short-iso"]
    try:
        process = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=PIPE, stderr=PIPE
        )
    except FileNotFoundError:
        return Excerpt("", "journalctl is not installed")
    try:
        async with asyncio.timeout(JOURNAL_TIMEOUT_S):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        return Excerpt("", f"journalctl did not finish in {JOURNAL_TIMEOUT_S:.0f} s")
    if process.returncode != 0:
        said = err.decode("utf-8", "replace").strip()[:500]
        return Excerpt("", f"journalctl exited with {process.returncode}: {said}")
    data = out[-max_bytes:] if max_bytes > 0 else b""
    return Excerpt(data.decode("utf-8", "replace"))


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    data: bytes


def write_archive(target: Path, members: Sequence[Member]) -> int:
    """Write ``members`` as ``target`` (a tar.gz, mode 0600); its size in bytes."""
    if target.exists() or target.is_symlink():
        raise HostFileError(f"{target} exists; give another --output path")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, ARCHIVE_MODE)
    except OSError as err:
        raise HostFileError(f"cannot create {tmp}: {err.strerror}") from err
    try:
        with os.fdopen(fd, "wb") as stream:
            with tarfile.open(fileobj=stream, mode="w:gz") as archive:
                now = time.time()
                for member in members:
                    info = tarfile.TarInfo(member.name)
                    info.size, info.mode, info.mtime = len(member.data), 0o600, int(now)
                    archive.addfile(info, io.BytesIO(member.data))
            stream.flush()
            os.fsync(stream.fileno())
        _place(tmp, target)
        _fsync_dir(target.parent)
        return target.stat().st_size
    except OSError as err:
        raise HostFileError(f"cannot write {target}: {err.strerror}") from err
    finally:
        tmp.unlink(missing_ok=True)


def _place(tmp: Path, target: Path) -> None:
    """``tmp`` as ``target``, never over an existing file: a hard link where the filesystem
    has them, else (vfat, a stick) a rename after the check above."""
    try:
        os.link(tmp, target)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise
        tmp.rename(target)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

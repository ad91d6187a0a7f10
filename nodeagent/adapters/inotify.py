"""Watch directories for changes with inotify, natively in asyncio (ctypes on libc, no polling).

``DirectoryWatcher`` reports WHICH watched directories changed, never what
changed in them: the consumer re-reads a reported directory. Events of a
burst (an editor's save, an unpacked bundle) are coalesced into one report.

Directories that do not exist yet are supported: the nearest existing
ancestor is watched for creations, and when the directory appears its own
watch is added and it is reported as changed (files may already be in it).
A watched directory that is deleted, moved away or replaced is reported as
changed and watched again as soon as it exists again.

How the watch set stays right without races: after every batch of events the
watcher recomputes, from the file system as it is now, the path each wanted
directory needs watched (itself, or its nearest existing ancestor) and fixes
the kernel's watches to match, comparing device and inode numbers so a
replaced directory gets a fresh watch. Whatever happened between two events
is found by that look, not inferred from the events.

Limits: changes inside subdirectories are seen only with ``recursive=True``.
A symlink in a watched directory is an entry like any other: creating,
replacing or removing the link is seen; writes to its target elsewhere are not.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import structlog

from nodeagent.errors import HostFileError

log = structlog.get_logger(__name__)

IN_MODIFY: Final = 0x002
IN_ATTRIB: Final = 0x004
IN_CLOSE_WRITE: Final = 0x008
IN_MOVED_FROM: Final = 0x040
IN_MOVED_TO: Final = 0x080
IN_CREATE: Final = 0x100
IN_DELETE: Final = 0x200
IN_DELETE_SELF: Final = 0x400
IN_MOVE_SELF: Final = 0x800
IN_Q_OVERFLOW: Final = 0x4000
IN_IGNORED: Final = 0x8000
IN_ONLYDIR: Final = 0x0100_0000
IN_NONBLOCK: Final = os.O_NONBLOCK
IN_CLOEXEC: Final = os.O_CLOEXEC

_SELF: Final = IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
CONTENT_MASK: Final = (
    IN_CREATE | IN_DELETE | IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB
) | _SELF
"""What a wanted directory is watched for: any change of an entry, and of itself."""
ANCESTOR_MASK: Final = IN_CREATE | IN_MOVED_TO | _SELF
"""What the ancestor of a missing directory is watched for: the next path step appearing."""

_EVENT: Final = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
_READ_BYTES: Final = 64 * 1024


def _libc() -> ctypes.CDLL:
    # The process's own symbols include libc; ctypes.util would load shutil, tempfile, lzma...
    lib = ctypes.CDLL(None, use_errno=True)
    lib.inotify_init1.argtypes = [ctypes.c_int]
    lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return lib


def _os_error(call: str, path: Path | None = None) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call}: {os.strerror(code)}", None if path is None else str(path))


@dataclass(frozen=True)
class Event:
    """One inotify event: the watch it came from, its mask and the entry name (may be empty)."""

    wd: int
    mask: int
    name: str


def parse_events(buffer: bytes) -> list[Event]:
    """Split what ``read`` returned from an inotify fd into events."""
    events, offset = [], 0
    while offset + _EVENT.size <= len(buffer):
        wd, mask, _cookie, length = _EVENT.unpack_from(buffer, offset)
        start = offset + _EVENT.size
        raw = buffer[start : start + length].rstrip(b"\0")
        events.append(Event(wd=wd, mask=mask, name=os.fsdecode(raw)))
        offset = start + length
    return events


@dataclass
class _Watch:
    wd: int
    mask: int
    identity: tuple[int, int]
    serves: frozenset[Path] = field(default_factory=frozenset)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return candidate
    return Path("/")


def _subdirectories(path: Path) -> list[Path]:
    found: list[Path] = []
    for root, dirs, _files in os.walk(path, followlinks=False):
        found.extend(Path(root) / name for name in dirs)
    return found


class _Inotify:
    """The kernel side: one inotify fd and a watch set kept equal to a wanted one."""

    def __init__(self) -> None:
        self._lib = _libc()
        fd = self._lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = _os_error("inotify_init1")
            raise HostFileError(f"cannot start watching files: {err}") from err
        self.fd: int = fd
        self.watches: dict[Path, _Watch] = {}

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read(self) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                chunk = os.read(self.fd, _READ_BYTES)
            except BlockingIOError:
                return events
            events.extend(parse_events(chunk))

    def path_of(self, wd: int) -> Path | None:
        return next((p for p, w in self.watches.items() if w.wd == wd), None)

    def forget(self, wd: int) -> None:
        """The kernel dropped this watch (IN_IGNORED)."""
        for path in [p for p, w in self.watches.items() if w.wd == wd]:
            del self.watches[path]

    def apply(self, wanted: dict[Path, tuple[int, frozenset[Path]]]) -> set[Path]:
        """Make the watch set equal ``wanted``; return the wanted dirs whose watch was (re)made."""
        for path in [p for p in self.watches if p not in wanted]:
            self._remove(path)
        changed: set[Path] = set()
        for path, (mask, serves) in wanted.items():
            current = self.watches.get(path)
            identity = _identity(path)
            if current and (current.identity, current.mask) == (identity, mask):
                current.serves = serves
                continue
            if current and current.identity != identity:
                self._remove(path)  # replaced or moved away: the old watch follows the old inode
            # Same inode, other mask: inotify_add_watch swaps the mask in place, same wd.
            if identity is None or not self._add(path, mask, identity, serves):
                raise _Vanished
            changed |= serves
        return changed

    def _add(
        self, path: Path, mask: int, identity: tuple[int, int], serves: frozenset[Path]
    ) -> bool:
        wd = self._lib.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = _os_error("inotify_add_watch", path)
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            raise HostFileError(f"cannot watch {path}: {err}; check permissions") from err
        self.watches[path] = _Watch(wd=wd, mask=mask, identity=identity, serves=serves)
        return True

    def _remove(self, path: Path) -> None:
        watch = self.watches.pop(path)
        if all(w.wd != watch.wd for w in self.watches.values()):
            self._lib.inotify_rm_watch(self.fd, watch.wd)  # EINVAL if already gone: fine


class _Vanished(Exception):
    """A path disappeared between looking at it and watching it: look again."""


class DirectoryWatcher:
    """Report which of some directories changed, coalescing bursts.

    Use as ``async with DirectoryWatcher([d1, d2]) as w: async for dirs in w: ...``;
    each report is a non-empty frozenset of the given paths. Nothing is reported
    for the state at start: read the directories once after entering, then
    re-read each reported one. A report comes once ``debounce_s`` passed
    without further events, or ``max_delay_s`` after the first event of a
    burst that keeps going.
    """

    _MAX_PASSES: Final = 16

    def __init__(
        self,
        directories: Iterable[Path],
        *,
        debounce_s: float = 0.2,
        max_delay_s: float | None = None,
        recursive: bool = False,
    ) -> None:
        self.directories = tuple(Path(os.path.normpath(Path(d).absolute())) for d in directories)
        self.debounce_s = debounce_s
        self.max_delay_s = max_delay_s if max_delay_s is not None else 10 * debounce_s
        self.recursive = recursive
        self._kernel: _Inotify | None = None
        self._changed: set[Path] = set()
        self._activity = asyncio.Event()
        self._failure: BaseException | None = None

    async def __aenter__(self) -> Self:
        self._kernel = _Inotify()
        try:
            self._reconcile()
            asyncio.get_running_loop().add_reader(self._kernel.fd, self._on_readable)
        except BaseException:
            self._kernel.close()
            raise
        self._changed.clear()
        log.debug("watch_started", directories=[str(d) for d in self.directories])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop watching and close the inotify fd (idempotent)."""
        if self._kernel is None:
            return
        asyncio.get_running_loop().remove_reader(self._kernel.fd)
        self._kernel.close()
        self._kernel = None
        self._activity.set()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> frozenset[Path]:
        await self._wait_activity(None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_delay_s
        while (remaining := deadline - loop.time()) > 0:
            if not await self._wait_activity(min(self.debounce_s, remaining)):
                break
        self._raise_if_failed()
        changed, self._changed = frozenset(self._changed), set()
        return changed

    async def _wait_activity(self, timeout_s: float | None) -> bool:
        """Wait for new events; False if ``timeout_s`` passed first."""
        self._raise_if_failed()
        if timeout_s is None:
            while not self._changed:
                self._activity.clear()
                await self._activity.wait()
                self._raise_if_failed()
            return True
        self._activity.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self._activity.wait()
        except TimeoutError:
            return False
        return True

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._kernel is None:
            raise StopAsyncIteration

    def _on_readable(self) -> None:
        try:
            self._consume()
        except OSError as err:
            self._failure = HostFileError(f"cannot read file change events: {err}")
            self._failure.__cause__ = err
        except HostFileError as err:
            self._failure = err
        if self._failure is not None and self._kernel is not None:
            asyncio.get_running_loop().remove_reader(self._kernel.fd)
        self._activity.set()

    def _consume(self) -> None:
        kernel = self._kernel
        assert kernel is not None  # noqa: S101 - the reader is removed before the fd is closed
        for event in kernel.read():
            self._note(kernel, event)
        self._reconcile()

    def _note(self, kernel: _Inotify, event: Event) -> None:
        if event.mask & IN_Q_OVERFLOW:
            log.warning("watch_queue_overflowed", directories=len(self.directories))
            self._changed.update(self.directories)
            return
        path = kernel.path_of(event.wd)
        if path is not None:
            self._changed.update(kernel.watches[path].serves)
        if event.mask & IN_IGNORED:
            kernel.forget(event.wd)

    def _wanted(self) -> dict[Path, tuple[int, frozenset[Path]]]:
        wanted: dict[Path, tuple[int, frozenset[Path]]] = {}

        def want(path: Path, mask: int, serves: frozenset[Path]) -> None:
            old_mask, old_serves = wanted.get(path, (0, frozenset()))
            wanted[path] = (old_mask | mask, old_serves | serves)

        for directory in self.directories:
            target = _nearest_existing(directory)
            if target != directory:
                want(target, ANCESTOR_MASK, frozenset())
                continue
            want(directory, CONTENT_MASK, frozenset({directory}))
            for sub in _subdirectories(directory) if self.recursive else ():
                want(sub, CONTENT_MASK, frozenset({directory}))
        return wanted

    def _reconcile(self) -> None:
        kernel = self._kernel
        assert kernel is not None  # noqa: S101 - only called while watching
        for _ in range(self._MAX_PASSES):
            try:
                self._changed |= kernel.apply(self._wanted())
            except _Vanished:
                continue
            return
        raise HostFileError(
            f"cannot watch {', '.join(map(str, self.directories))}: "
            "they keep disappearing while being watched; retry later"
        )

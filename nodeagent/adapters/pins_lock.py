"""The one lock on nodeagent's CRI-O pin file (decision 0044): ``<run dir>/pins.lock``.

Two writers of the pin file exist: the daemon, which holds the lock for its whole life (it
watches CRI-O's drop-in directories itself and re-renders), and ``nodeagent render-pins
--write`` (the unit's ExecStartPre and the path unit that re-renders when another drop-in
changes while the daemon is stopped), which takes it without waiting and, when the daemon
holds it, leaves the file to the daemon. ``flock(2)``: the kernel drops the lock when its
holder exits, however it exits, so a crash never leaves a stale lock behind. The file holds
the holder's PID, for messages only.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from pathlib import Path
from typing import Final

from nodeagent.errors import HostFileError
from nodeagent.strict import clip

PINS_LOCK_NAME: Final = "pins.lock"
MAX_HOLDER_BYTES: Final = 32


class PinsLock:
    """An exclusive ``flock`` on ``path`` (created 0600 with its directory when absent)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def is_held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if free; False when another process holds it."""
        if self._fd is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as err:
            raise HostFileError(f"cannot open the pin lock {self.path}: {err.strerror}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError as err:
            os.close(fd)
            raise HostFileError(f"cannot lock {self.path}: {err.strerror}") from err
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    async def acquire(self, timeout_s: float, *, poll_s: float = 0.1) -> None:
        """Take the lock, waiting up to ``timeout_s`` for a ``render-pins`` to finish.

        Raises ``HostFileError`` naming the holder when it is still held then (another
        daemon runs with the same run directory)."""
        deadline = time.monotonic() + timeout_s
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                raise HostFileError(
                    f"{self.path} is held by process {self.holder()} for longer than "
                    f"{timeout_s:g} s: is another nodeagent running with the same run directory?"
                )
            await asyncio.sleep(poll_s)

    def holder(self) -> str:
        """The PID the holder wrote, for messages ("unknown" when unreadable)."""
        try:
            with self.path.open("rb") as stream:
                text = stream.read(MAX_HOLDER_BYTES).decode("ascii").strip()
        except (OSError, UnicodeDecodeError):
            return "unknown"
        return text if text.isdigit() else clip(text, 16) or "unknown"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

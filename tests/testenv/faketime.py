"""One process's wall clock stepped, the host's untouched: libfaketime (Debian's ``libfaketime``).

``FakeClock(path)`` keeps an offset in a file; ``env()`` gives what a process is started
with so that its wall clock (``time.time``, ``datetime.now``, OpenSSL's certificate checks:
``CLOCK_REALTIME``) is the host's plus that offset, read again at every call, while its
monotonic clocks (``time.monotonic``, asyncio's loop time) stay the kernel's: the case of an
NTP step on a real node. ``step(seconds)`` changes the offset of every process started with
it at once. Children inherit it (``LD_PRELOAD`` is in their environment too).

What libfaketime does, and the variables used, are in docs/runtime-facts.md ("libfaketime").
Observed with Debian 12's 0.9.10: file timestamps (``stat``) pass through unchanged, and a
call to ``time.time`` costs about 5 µs with the file read at each call (``time.monotonic``
is not slowed).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.testenv.packages import PACKAGES, ensure_packages

LIBFAKETIME = Path(PACKAGES["libfaketime"])
"""The thread-safe build: the daemon runs worker threads (file I/O, hashing)."""


def ensure_libfaketime() -> Path:
    """Install Debian's ``libfaketime`` when it is missing; the library's path."""
    ensure_packages({"libfaketime": str(LIBFAKETIME)})
    return LIBFAKETIME


SHM = Path("/dev/shm")
SHARED = re.compile(r"^(?:faketime_shm_|sem\.faketime_sem_)(\d+)$")
"""What libfaketime leaves in ``/dev/shm`` for each process it was loaded in (named by its
pid): a Python process left its two here even on a normal exit (``date`` did not)."""


def left_behind(shm: Path = SHM) -> set[Path]:
    """libfaketime's files in ``shm`` whose process is gone."""
    found = set()
    for entry in shm.iterdir() if shm.is_dir() else ():
        named = SHARED.match(entry.name)
        if named is not None and not Path(f"/proc/{named[1]}").exists():
            found.add(entry)
    return found


class FakeClock:
    """The wall-clock offset, in seconds, of the processes started with ``env()``;
    ``close()`` (or ``with``) removes what libfaketime left in ``/dev/shm`` for the processes
    that have ended (a new process with the same pid would fail to start its clock)."""

    def __init__(self, path: Path, offset_s: int = 0) -> None:
        self.path = path
        self.offset_s = 0
        self.step_to(offset_s)

    def close(self) -> None:
        for entry in left_behind():
            entry.unlink(missing_ok=True)

    def __enter__(self) -> FakeClock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": str(ensure_libfaketime()),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def step_to(self, offset_s: int) -> None:
        """The wall clock becomes the host's plus ``offset_s`` (renamed in whole: a reader
        never sees half a line)."""
        staged = self.path.with_name(self.path.name + ".new")
        staged.write_text(f"{offset_s:+d}\n")
        staged.replace(self.path)
        self.offset_s = offset_s

    def step(self, seconds: int) -> None:
        """Step the wall clock by ``seconds`` (forward when positive)."""
        self.step_to(self.offset_s + seconds)

    def seen_offset_s(self) -> float:
        """The offset a process started with ``env()`` sees now (``date +%s`` run with it,
        against this process's own clock): proof the library takes effect."""
        env = dict(os.environ, **self.env())
        before = subprocess.run(["date", "+%s"], capture_output=True, text=True, check=True)
        shown = subprocess.run(["date", "+%s"], capture_output=True, text=True, check=True, env=env)
        return int(shown.stdout) - int(before.stdout)

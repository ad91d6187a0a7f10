"""What ``bench.release_scale`` measures around each step: peak RSS, disk at the peak, fits.

* ``Peaks``: a thread that polls, every ``POLL_S``, ``VmHWM`` (the kernel's own peak RSS
  of a process, so a poll between two peaks misses nothing but the last moments of a
  process that exits between polls) of every process below the roots it is given
  (``/proc/PID/task/*/children``), named by role (``nodeagent bundle import``,
  ``nodeagent serve-session``, ``crio``, ``skopeo`` ...), and the bytes used on the
  scratch filesystem (``statvfs``) above what it held when the step began;
* ``scratch_fs``: that filesystem: an ext4 image of its own on a loop device, mounted
  read-write, holding everything a step writes (CRI-O's storage, the node's store,
  skopeo's targets, ``TMPDIR``), so its used bytes are the step's disk and nothing else's
  (the machine is shared);
* ``fit``: least squares of a figure against the size, its value at 16 GiB, and how
  well a line through the origin (a pure per-GiB cost) explains the smaller size.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20
GIB = 1 << 30
POLL_S = 0.05
LABEL = "NABENCHSCALE"  # not NODEAGENT*: a media watcher on this host must leave it alone


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _status_kib(pid: int) -> dict[str, int] | None:
    """The ``kB`` figures of /proc/PID/status (None: the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    found = {}
    for line in lines:
        key, _, value = line.partition(":")
        if value.endswith(" kB"):
            found[key] = int(value.split()[0])
    return found


def role(pid: int, parent: str = "") -> str:
    """``nodeagent <command> [<subcommand>]`` for nodeagent, ``-m MODULE`` for another
    module, else the program's name; a bare interpreter (``python -c``) started by a
    nodeagent process is that process's ``... (child)``."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return "?"
    args = [arg for arg in raw.split("\0") if arg]
    if parent.startswith("nodeagent") and "-m" not in args and "python" in (args or ["?"])[0]:
        return f"{parent.removesuffix(' (child)')} (child)"
    module = args[args.index("-m") + 1] if "-m" in args[:-1] else None
    if module is not None and module != "nodeagent":
        return module
    if module == "nodeagent":
        rest = args[args.index("-m") + 2 :]
        words: list[str] = []
        skip = False
        for arg in rest:
            if skip:
                skip = False
            elif arg == "--config":
                skip = True
            elif arg.startswith("-") or "/" in arg or len(words) == 2:
                break
            else:
                words.append(arg)
        return " ".join(["nodeagent", *words])
    return Path(args[0]).name if args and args[0] else "?"


@dataclass
class Peaks:
    """Peak RSS per role and disk used at the peak, polled while the context is open."""

    roots: Callable[[], Iterable[int]]
    scratch: Path | None
    rss_kib: dict[str, int] = field(default_factory=dict)
    """Peak RSS (VmHWM) per role."""
    anon_kib: dict[str, int] = field(default_factory=dict)
    """Largest anonymous RSS (RssAnon) seen per role: sampled, so at most the peak."""
    disk_bytes: int = 0
    base_used: int | None = None
    """Bytes used on ``scratch`` that are not the step's (None: what it held at the start)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _roles: dict[int, str] = field(default_factory=dict)

    def _used(self) -> int:
        if self.scratch is None:
            return 0
        info = os.statvfs(self.scratch)
        return (info.f_blocks - info.f_bfree) * info.f_frsize

    def _poll(self) -> None:
        pending = [(pid, "") for pid in self.roots()]
        seen: set[int] = set()
        while pending:
            pid, parent = pending.pop()
            if pid in seen:
                continue
            seen.add(pid)
            status = _status_kib(pid)
            if status is None:
                continue
            name = self._roles.setdefault(pid, role(pid, parent))
            pending += [(child, name) for child in _children(pid)]
            self.rss_kib[name] = max(self.rss_kib.get(name, 0), status.get("VmHWM", 0))
            self.anon_kib[name] = max(self.anon_kib.get(name, 0), status.get("RssAnon", 0))
        self.disk_bytes = max(self.disk_bytes, self._used() - (self.base_used or 0))

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self._poll()

    @contextmanager
    def watching(self) -> Iterator[Peaks]:
        if self.base_used is None:
            self.base_used = self._used()
        thread = threading.Thread(target=self._loop, name="peaks", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()
            self._poll()

    def rss_mib(self) -> dict[str, float]:
        return {name: round(kib / 1024, 1) for name, kib in sorted(self.rss_kib.items())}

    def anon_mib(self) -> dict[str, float]:
        return {name: round(kib / 1024, 1) for name, kib in sorted(self.anon_kib.items())}


def used_bytes(path: Path) -> int:
    info = os.statvfs(path)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


@contextmanager
def scratch_fs(image: Path, mountpoint: Path, size_bytes: int) -> Iterator[Path]:
    """An empty ext4 filesystem of ``size_bytes`` (sparse image) mounted at ``mountpoint``."""
    with image.open("wb") as sparse:
        sparse.truncate(size_bytes)
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", LABEL, str(image)], capture_output=True, check=True
    )
    mountpoint.mkdir(parents=True, exist_ok=True)
    devnode = subprocess.run(
        ["losetup", "--find", "--show", str(image)], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        # discard: a file removed inside gives its blocks back to the disk under the image
        subprocess.run(["mount", "-o", "discard", devnode, str(mountpoint)], check=True)
        try:
            yield mountpoint
        finally:
            if subprocess.run(["umount", str(mountpoint)], check=False).returncode:
                subprocess.run(["umount", "--lazy", str(mountpoint)], check=False)
    finally:
        subprocess.run(["losetup", "--detach", devnode], check=False)
        image.unlink(missing_ok=True)


@dataclass(frozen=True)
class Fit:
    slope_per_gib: float
    intercept: float
    at_full: float
    """The fitted value at ``full_gib``."""
    max_residual: float
    """Largest |measured - fitted| / measured over the sizes (0 with two sizes)."""
    proportional_miss: float | None
    """|smallest measured - (largest measured x size ratio)| / smallest measured: how far a
    pure per-GiB cost is from explaining both sizes (None with one size)."""


def fit(points: list[tuple[float, float]], full_gib: float = 16.0) -> Fit | None:
    """Least squares of ``(size GiB, value)`` points; None below two distinct sizes."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    intercept = mean_y - slope * mean_x
    residuals = [abs(y - (intercept + slope * x)) / abs(y) for x, y in points if y]
    small, large = min(points), max(points)
    proportional = (
        abs(small[1] - large[1] * small[0] / large[0]) / abs(small[1]) if small[1] else None
    )
    return Fit(slope, intercept, intercept + slope * full_gib, max(residuals, default=0.0),
               proportional)  # fmt: skip

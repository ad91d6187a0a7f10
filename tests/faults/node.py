"""The drilled node: the real daemon, a real CRI-O, the real registry behind a faulty proxy.

``DrillNode`` holds one of each, every file in the test's temp dir, plus two observers
that run for the whole drill:

* ``NotifyListener``: the service manager's end of ``NOTIFY_SOCKET`` (a datagram socket,
  as systemd binds it), so a drill sees ``READY=1`` and every ``STATUS=`` line the daemon
  sends, exactly what ``systemctl status nodeagent`` would show;
* ``LinkWatch``: polls CRI-O's pin drop-in link every few milliseconds and records every
  moment it dangled or its target did not parse, and each pin list it held.

``power_cut`` and ``boot`` play a power loss and the units' real start order (see their
docstrings). Images are referenced through the proxy (``ref``), so every pull crosses it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import socket
import struct
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.adapters.inotify import (
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
)
from tests.testenv.agent import Agent
from tests.testenv.crio import Crio, _unmount_below
from tests.testenv.faulty_proxy import FaultyProxy
from tests.testenv.registry import Registry
from tests.testenv.waiting import wait_for

DROPIN = "99-nodeagent-pinned-images.conf"
"""nodeagent's pin drop-in: the file in its transient dir, the link in CRI-O's drop-in dir."""


class NotifyListener:
    """Receives sd_notify datagrams on a unix socket, in a thread, and keeps every one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.2)
        self._lock = threading.Lock()
        self._messages: list[dict[str, str]] = []
        self._received_s: list[float] = []
        self._is_open = True
        self._thread = threading.Thread(target=self._receive, name="notify", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while self._is_open:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            lines = data.decode(errors="replace").splitlines()
            fields = dict(line.split("=", 1) for line in lines if "=" in line)
            with self._lock:
                self._messages.append(fields)
                self._received_s.append(time.monotonic())

    def messages(self) -> list[dict[str, str]]:
        with self._lock:
            return list(self._messages)

    def count(self) -> int:
        with self._lock:
            return len(self._messages)

    def seconds_since(self, key: str) -> float | None:
        """Seconds since the last message carrying ``key`` (``WATCHDOG``, say); None if none."""
        with self._lock:
            times = [t for t, m in zip(self._received_s, self._messages, strict=True) if key in m]
        return time.monotonic() - times[-1] if times else None

    def statuses(self, since: int = 0) -> list[str]:
        """Every ``STATUS=`` line from message number ``since`` on."""
        return [m["STATUS"] for m in self.messages()[since:] if "STATUS" in m]

    def wait_ready(self, *, since: int = 0, timeout_s: float = 60.0) -> None:
        wait_for(
            lambda: any(m.get("READY") == "1" for m in self.messages()[since:]),
            timeout_s=timeout_s,
            what="READY=1 on NOTIFY_SOCKET",
        )

    def close(self) -> None:
        self._is_open = False
        self._thread.join(timeout=2)
        self._sock.close()


@dataclass(frozen=True)
class Sighting:
    """One moment ``LinkWatch`` saw something wrong with the pin drop-in."""

    at_s: float
    what: str


class LinkWatch:
    """Watches the pin drop-in link: dangling moments, unparsable targets, pin lists held.

    Two threads: one reads the link every ``interval_s`` (a dangling link, a target that
    does not parse, each new pin list); one follows inotify on the target's directory, so a
    removal of the target (or of its directory) while the link exists is seen however
    briefly it lasts. A link that does not exist yet is not dangling (the daemon creates it
    at its first write). ``pause()``/``resume()`` cover the moments no service runs, such as
    a power cut until systemd-tmpfiles recreated ``/run``.
    """

    def __init__(self, link: Path, target: Path, *, interval_s: float = 0.005) -> None:
        self.link = link
        self.target = target
        self.interval_s = interval_s
        self.sightings: list[Sighting] = []
        self.history: list[tuple[float, frozenset[str]]] = []
        """(monotonic time, pins) each time the pin list changed."""
        self._is_paused = False
        self._is_open = True
        self._last: bytes | None = None
        self._lock = threading.Lock()
        self._removals = _Removals(target)
        self._threads = [
            threading.Thread(target=self._poll, name="link-watch", daemon=True),
            threading.Thread(target=self._follow, name="link-inotify", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _poll(self) -> None:
        while self._is_open:
            with self._lock:
                if not self._is_paused:
                    self._look()
            time.sleep(self.interval_s)

    def _follow(self) -> None:
        while self._is_open:
            removed = self._removals.wait(timeout_s=0.1)
            with self._lock:
                if removed and not self._is_paused and self.link.is_symlink():
                    self._saw(f"the link's target was removed ({removed})")

    def _saw(self, what: str) -> None:
        self.sightings.append(Sighting(time.monotonic(), what))

    def _look(self) -> None:
        if not self.link.is_symlink():
            return
        try:
            data = self.link.read_bytes()
        except FileNotFoundError:
            if self.link.is_symlink():  # still a link: it dangles
                self._saw("the link dangles")
            return
        if data == self._last:
            return
        self._last = data
        try:
            pins = frozenset(pins_of(data.decode()))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, TypeError) as err:
            self._saw(f"the target does not parse: {err}")
            return
        self.history.append((time.monotonic(), pins))

    def pause(self) -> None:
        with self._lock:
            self._is_paused = True

    def resume(self) -> None:
        """Watch again; what happened while paused (events not read yet) is dropped."""
        with self._lock:
            self._removals.drain()
            self._is_paused = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def pins_now(self) -> frozenset[str]:
        return self.history[-1][1] if self.history else frozenset()

    def times_without(self, refs: set[str], *, since_s: float) -> list[float]:
        """When, from ``since_s`` on, the drop-in lacked any of ``refs``."""
        held = [(t, pins) for t, pins in self.history if t >= since_s]
        before = [pins for t, pins in self.history if t < since_s][-1:]
        lacking = [since_s for pins in before if not refs <= pins]
        return lacking + [t for t, pins in held if not refs <= pins]

    def close(self) -> None:
        self._is_open = False
        for thread in self._threads:
            thread.join(timeout=2)
        self._removals.close()


class _Removals:
    """inotify on a file's directory: the file removed or renamed away, or the directory
    itself removed. The watch is (re)added whenever the directory exists again."""

    MASK = IN_DELETE | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF
    EVENT = struct.Struct("iIII")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd: int = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._wd = -1

    def _ensure_watch(self) -> None:
        if self._wd < 0 and self.path.parent.is_dir():
            directory = str(self.path.parent).encode()
            self._wd = self._libc.inotify_add_watch(self._fd, directory, self.MASK)

    def wait(self, *, timeout_s: float) -> str:
        """What was removed within ``timeout_s`` (empty: nothing)."""
        self._ensure_watch()
        ready, _, _ = select.select([self._fd], [], [], timeout_s)
        return self.drain() if ready else ""

    def drain(self) -> str:
        """Read every pending event; name the removals among them."""
        removed: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return ", ".join(removed)
            offset = 0
            while offset < len(data):
                _wd, mask, _cookie, size = self.EVENT.unpack_from(data, offset)
                name = data[offset + 16 : offset + 16 + size].rstrip(b"\0").decode()
                offset += 16 + size
                if mask & IN_IGNORED:
                    self._wd = -1
                if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                    removed.append(
                        f"{self.path.parent} {'deleted' if mask & IN_DELETE_SELF else 'moved'}"
                    )
                elif mask & (IN_DELETE | IN_MOVED_FROM) and name == self.path.name:
                    removed.append(f"{name} {'deleted' if mask & IN_DELETE else 'moved away'}")

    def close(self) -> None:
        os.close(self._fd)


def pins_of(text: str) -> list[str]:
    """``pinned_images`` of a CRI-O drop-in's ``[crio.image]`` table (empty: none)."""
    pins = tomllib.loads(text).get("crio", {}).get("image", {}).get("pinned_images", [])
    if not isinstance(pins, list):
        raise TypeError(f"pinned_images is a {type(pins).__name__}")
    return [str(p) for p in pins]


@dataclass(frozen=True)
class Mark:
    """Where the logs stood at a moment: what came later is checked for duplicate pulls."""

    agent_log: int = 0
    crio_log: int = 0


@dataclass
class DrillNode:
    """The real daemon, CRI-O and registry (behind ``proxy``), and what watches them."""

    base: Path
    registry: Registry
    proxy: FaultyProxy
    crio: Crio
    agent: Agent
    notify: NotifyListener
    watch: LinkWatch
    marks: list[Mark] = field(default_factory=list)

    def ref(self, reference: str) -> str:
        """The same image through the proxy."""
        return reference.replace(self.registry.host, self.proxy.host, 1)

    @property
    def link(self) -> Path:
        return self.crio.dropin_dir / DROPIN

    @property
    def target(self) -> Path:
        return self.agent.transient_dropin_dir / DROPIN

    def mark(self) -> Mark:
        """The logs' current ends."""
        agent_log = len(self.agent.log_text().encode())
        crio_log = self.crio.log_path.stat().st_size if self.crio.log_path.exists() else 0
        return Mark(agent_log, crio_log)

    def agent_log_since(self, mark: Mark) -> str:
        return self.agent.log_path.read_bytes()[mark.agent_log :].decode(errors="replace")

    def crio_log_since(self, mark: Mark) -> str:
        return self.crio.log_path.read_bytes()[mark.crio_log :].decode(errors="replace")

    # ---------------------------------------------------------------- power
    def power_cut(self, *, is_store_lost: bool = True) -> None:
        """Both killed at once (SIGKILL), then what a reboot loses: every ``/run`` of the
        test's root (tmpfs) and, unless ``is_store_lost`` is False, CRI-O's image store (an
        unclean shutdown may cost it: CRI-O wipes a store it finds damaged)."""
        # Both signalled before either is reaped: killed one after the other, CRI-O had time
        # to see the daemon's loopback mirror go and ask the image's own registry instead
        # (a drill counted that request), which a real power cut never lets it do.
        for process in (self.agent.process, self.crio.process):
            if process is not None:
                process.kill()
        self.agent.kill()
        self.crio.kill()
        self.watch.pause()  # nothing runs until boot(): the link may dangle meanwhile
        lost = [self.crio.base / "run", self.agent.base / "run"]
        for path in lost:  # a reboot loses every mount (a stick's too: it stays plugged in)
            _unmount_below(path)
        for path in [*lost, self.crio.storage_root] if is_store_lost else lost:
            shutil.rmtree(path, ignore_errors=True)
        (self.crio.base / "run").mkdir()

    def boot(self) -> None:
        """The units' real start order after a reboot:

        1. systemd-tmpfiles (``systemd/nodeagent.tmpfiles``): the ``d`` and ``f`` lines make
           the pin file's directory, an empty pin file and the transient spec directory;
        2. ``nodeagent render-pins --write``, nodeagent.service's ExecStartPre, must exit 0;
        3. ``nodeagent run`` until it sends READY=1 (``Type=notify``);
        4. CRI-O (``Before=crio.service`` in nodeagent's unit: CRI-O starts after READY).
        """
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.target.touch(mode=0o644)
        self.agent.transient_dir.mkdir(parents=True, exist_ok=True)
        self.watch.resume()  # from here on the link must hold
        rendered = self.agent.cli("render-pins", "--write")
        assert rendered.returncode == 0, f"render-pins --write: {rendered.returncode}\n" + (
            rendered.stdout + rendered.stderr
        )
        since = self.notify.count()
        self.agent.start()
        self.notify.wait_ready(since=since)
        self.crio.start()

    def close(self) -> None:
        self.watch.close()
        with contextlib.suppress(Exception):
            if self.agent.process is not None and self.agent.process.poll() is None:
                self.agent.stop(timeout_s=10)  # then SIGKILL: a drill may leave it stuck
        self.agent.kill()
        self.notify.close()
        self.crio.cleanup()

"""The unix datagram socket the peer server's process reports to the daemon on.

The daemon binds it (``ReportSocket``) in ``<[state] run_dir>/peer/``, a directory the
package makes ``2750 root:nodeagent-peer`` (systemd/nodeagent.tmpfiles): the socket inherits
the directory's group (set-group-ID) and is made ``0660``, so only root and the peer
server's group can send to it, and no other local user can even reach it. The peer process
sends with ``ReportSender``, never blocking (a full queue or a daemon that is not listening
is a False, and the report is kept to be sent again). Datagrams are read whole and at most
``MAX_REPORT_BYTES`` + 1 bytes long, so a longer one is seen as too long and refused
(``nodeagent.site.reports``); the kernel's receive queue bounds what waits.
"""

from __future__ import annotations

import asyncio
import socket
import stat
from pathlib import Path
from typing import Final

from nodeagent.errors import HostFileError
from nodeagent.site.reports import MAX_REPORT_BYTES

SOCKET_MODE: Final = 0o660
DIR_MODE: Final = 0o750


class ReportSocket:
    """The daemon's end: bound at ``path`` until closed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock: socket.socket | None = None

    def open(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self.path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            self._remove_stale()
            sock.bind(str(self.path))
            self.path.chmod(SOCKET_MODE)
            sock.setblocking(False)
        except OSError as err:
            sock.close()
            raise HostFileError(
                f"cannot listen for the peer server's reports on {self.path}: "
                f"{err.strerror or err}; check that {self.path.parent} is a writable directory"
            ) from err
        self._sock = sock

    def _remove_stale(self) -> None:
        try:
            info = self.path.lstat()
        except FileNotFoundError:
            return
        if stat.S_ISSOCK(info.st_mode):
            self.path.unlink()

    async def receive(self) -> bytes:
        """The next datagram (cut at ``MAX_REPORT_BYTES`` + 1 bytes)."""
        if self._sock is None:
            raise RuntimeError("the report socket is not open")
        loop = asyncio.get_running_loop()
        return await loop.sock_recv(self._sock, MAX_REPORT_BYTES + 1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self.path.unlink(missing_ok=True)


class ReportSender:
    """The peer process's end: one datagram per report, never blocking."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def send(self, data: bytes) -> bool:
        """True when the daemon's socket took the datagram."""
        try:
            self._sock.sendto(data, socket.MSG_DONTWAIT, str(self.path))
        except OSError:
            return False
        return True

    def close(self) -> None:
        self._sock.close()

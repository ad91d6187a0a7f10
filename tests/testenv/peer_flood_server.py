"""The real peer server in a process of its own, so that its resident memory is its own.

``python -m tests.testenv.peer_flood_server '<json>'`` serves the store ``store`` with the
certificate file ``server_file`` (certificate and key in one, as the kubelet's) and the
trust bundle ``ca_file`` on 127.0.0.1 (a free port), with the caps given
(``max_connections``, ``max_per_source``, ``handshake_s``; optional ``read_buffer_bytes``
sets the TLS read buffer, to measure asyncio's default against nodeagent's). It prints
``{"port": N, "pid": P}`` once serving, then answers each line ``stats`` on its standard
input with ``{"open", "admitted", "refused", "fds", "tls_built", "pushed_out"}``, and
stops at end of input. ``PeerProcess`` starts and drives it from a test.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

READY_S = 30.0
"""How long the process may take to import aiohttp and start serving."""


@dataclass(frozen=True)
class Settings:
    store: Path
    server_file: Path
    ca_file: Path
    max_connections: int
    max_per_source: int
    handshake_s: float
    request_timeout_s: float = 20.0
    read_buffer_bytes: int | None = None

    def to_json(self) -> str:
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(self).items()})


async def _serve(settings: Settings) -> None:
    from nodeagent.adapters.http import handshake
    from nodeagent.adapters.http.admission import Caps
    from nodeagent.adapters.http.peer import PeerServer
    from nodeagent.adapters.http.tls import ReloadingTls
    from nodeagent.logs import configure

    configure("info", sys.stderr)  # the journal's lines to the log file; stdout is the answers

    if settings.read_buffer_bytes is not None:
        handshake._Watched.max_size = settings.read_buffer_bytes
    tls = ReloadingTls(settings.server_file, settings.server_file, settings.ca_file)
    server = PeerServer(
        settings.store,
        tls,
        node="node-0",
        host="127.0.0.1",
        port=0,
        max_uploads=3,
        upload_max_bytes=0,
        request_timeout_s=settings.request_timeout_s,
        caps=Caps(settings.max_connections, settings.max_per_source),
        handshake_timeout_s=settings.handshake_s,
    )
    loop = asyncio.get_running_loop()
    async with server:
        _say({"port": server.port, "pid": os.getpid()})
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            door = server.door
            fds = _fd_count()
            _say(
                {
                    "open": door.open,
                    "admitted": door.admitted,
                    "refused": door.refused,
                    "fds": fds,
                    "tls_built": server.tls_built,
                    "pushed_out": door.pushed_out,
                }
            )


def _fd_count() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


def _say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


class PeerProcess:
    """Drives ``python -m tests.testenv.peer_flood_server`` (a context manager)."""

    def __init__(self, settings: Settings, log_file: Path) -> None:
        self._settings, self._log_file = settings, log_file
        self._proc: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> PeerProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        with self._log_file.open("w") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.testenv.peer_flood_server", self._settings.to_json()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        self.port = int(self._read()["port"])
        return self

    def __exit__(self, *exc_info: object) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("not started")
        return self._proc.pid

    def stats(self) -> dict[str, Any]:
        stdin = self._pipe(self._proc.stdin if self._proc else None)
        stdin.write("stats\n")
        stdin.flush()
        return self._read()

    def rss_kib(self) -> int:
        """VmRSS of the server process, in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def _read(self) -> dict[str, Any]:
        """The process's next line (one JSON object), within ``READY_S``."""
        stdout = self._pipe(self._proc.stdout if self._proc else None)
        ready, _, _ = select.select([stdout], [], [], READY_S)
        line = stdout.readline() if ready else ""
        if not line:
            tail = self._log_file.read_text()[-3000:]
            raise RuntimeError(f"the peer process did not answer within {READY_S} s: {tail}")
        message: dict[str, Any] = json.loads(line)
        return message

    @staticmethod
    def _pipe(pipe: IO[str] | None) -> IO[str]:
        if pipe is None:
            raise RuntimeError("not started")
        return pipe


if __name__ == "__main__":
    fields = json.loads(sys.argv[1])
    for name in ("store", "server_file", "ca_file"):
        fields[name] = Path(fields[name])
    asyncio.run(_serve(Settings(**fields)))

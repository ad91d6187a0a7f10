"""The host's loopback service, reachable from node namespaces at the same address.

The test kube-apiserver (``tests/testenv/kube.py``) listens on the host's 127.0.0.1, and
its serving certificate and every kubeconfig name ``https://127.0.0.1:<port>``. A node
namespace has a loopback of its own, so ``python -m tests.testenv.ns_relay PORT NETNS...``
(run in the host's namespace) opens a listening socket on 127.0.0.1:PORT inside each named
namespace (it enters the namespace with ``setns`` just long enough to create the socket; a
socket stays in the namespace it was made in) and copies every connection accepted there
to 127.0.0.1:PORT here, both ways, bytes untouched (TLS runs end to end). The same
kubeconfig then works from every node, and the traffic never leaves the two loopbacks.

``KubeRelay(port, namespaces, log_path)`` runs it; it prints ``ready`` once every
socket listens, and stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from tests.testenv.lifecycle import Service
from tests.testenv.waiting import log_tail

CLONE_NEWNET = 0x40000000
CHUNK = 1 << 16
REPO = Path(__file__).resolve().parents[2]


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def listen_in(netns: str, port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` inside the named network namespace."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            return socket.create_server(("127.0.0.1", port))
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()


async def _relay(port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
    for w in (up_writer, writer):
        w.close()


async def serve(port: int, namespaces: Sequence[str]) -> None:
    sockets = [listen_in(ns, port) for ns in namespaces]
    servers = [await asyncio.start_server(lambda r, w: _relay(port, r, w), sock=s) for s in sockets]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


class KubeRelay(Service):
    """The relay process for ``port`` into ``namespaces``."""

    def __init__(self, port: int, namespaces: Sequence[str], log_path: Path) -> None:
        self.port = port
        self.namespaces = list(namespaces)
        self.log_path = log_path
        self._process: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w")
        cmd = [sys.executable, "-m", "tests.testenv.ns_relay", str(self.port), *self.namespaces]
        self._process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=REPO
        )
        assert self._process.stdout is not None
        if self._process.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError(f"the relay did not start\n{log_tail(self.log_path)}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), sys.argv[2:]))

"""A minimal client of `skopeo experimental-image-proxy`: how rpm-ostree reads an image.

rpm-ostree (through ostree-ext's containers-image-proxy) does not link containers/image: it
starts `skopeo experimental-image-proxy --sockfd N` with one end of a `SOCK_SEQPACKET`
socketpair and speaks JSON over it (docs/runtime-facts.md, "The OS image"): one request per
packet, `{"method": M, "args": [...]}`, one reply per packet,
`{"success": bool, "value": V, "pipeid": N, "error": S}`. Payload (a manifest, a blob) does
not travel on the socket: the reply carries the read end of a pipe as SCM_RIGHTS ancillary
data, and the proxy closes its write end only when the client sends `FinishPipe(pipeid)`,
whose reply says whether all of it was written (and, for a blob, verified).

`ImageProxy(command_for)` runs `command_for(fd)` (the proxy with `--sockfd fd`, perhaps
wrapped in a private mount namespace), the socket's other end inherited as `fd`, and offers
`initialize`, `open_image`, `get_manifest` (digest and OCI manifest bytes), `get_blob`,
`close_image`, `close`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_PACKET = 32 * 1024
"""The proxy's maximum message size (skopeo's maxMsgSize)."""


class ProxyError(Exception):
    """The proxy answered `success: false`, or broke the protocol."""


@dataclass(frozen=True)
class Reply:
    value: Any
    pipeid: int
    fd: int | None


def _read_all(fd: int, out: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as pipe:
        out.append(pipe.read())


class ImageProxy:
    """One proxy process and its socket; use as a context manager."""

    def __init__(
        self, command_for: Callable[[int], Sequence[str]], env: dict[str, str] | None = None
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        ours.settimeout(60)
        self._process = subprocess.Popen(
            list(command_for(theirs.fileno())), env=env, pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        theirs.close()

    def call(self, method: str, *args: Any) -> Reply:
        self._sock.send(json.dumps({"method": method, "args": list(args)}).encode())
        data, fds, _flags, _addr = socket.recv_fds(self._sock, MAX_PACKET, 1)
        if not data:
            raise ProxyError(f"{method}: the proxy closed the socket: {self.stderr()}")
        reply = json.loads(data)
        fd = fds[0] if fds else None
        if not reply.get("success"):
            if fd is not None:
                os.close(fd)
            raise ProxyError(f"{method}: {reply.get('error')}")
        return Reply(reply.get("value"), int(reply.get("pipeid") or 0), fd)

    def initialize(self) -> str:
        version = self.call("Initialize").value
        if not isinstance(version, str) or not version.startswith("0.2."):
            raise ProxyError(f"unsupported protocol version {version!r}")
        return version

    def open_image(self, reference: str) -> int:
        handle = self.call("OpenImage", reference).value
        if not isinstance(handle, int) or handle <= 0:
            raise ProxyError(f"OpenImage returned {handle!r}")
        return handle

    def get_manifest(self, handle: int) -> tuple[str, bytes]:
        """The image's digest (of the manifest as stored) and its manifest, as OCI."""
        reply = self.call("GetManifest", handle)
        if not isinstance(reply.value, str):
            raise ProxyError("GetManifest: no digest in the reply")
        return reply.value, self._drain(reply, "GetManifest")

    def get_blob(self, handle: int, digest: str, size: int) -> bytes:
        """The blob `digest` of `size` bytes; the proxy checks both (FinishPipe fails if not)."""
        return self._drain(self.call("GetBlob", handle, digest, size), "GetBlob")

    def _drain(self, reply: Reply, method: str) -> bytes:
        """Read the reply's pipe to its end while FinishPipe lets the proxy close it."""
        if reply.fd is None:
            raise ProxyError(f"{method}: no pipe in the reply")
        chunks: list[bytes] = []
        reader = threading.Thread(target=_read_all, args=(reply.fd, chunks))
        reader.start()
        try:
            self.call("FinishPipe", reply.pipeid)  # the proxy closes its end only now
        finally:
            reader.join(timeout=60)
        if reader.is_alive() or not chunks:
            raise ProxyError(f"{method}: the pipe was not closed")
        return chunks[0]

    def close_image(self, handle: int) -> None:
        self.call("CloseImage", handle)

    def stderr(self) -> str:
        if self._process.poll() is None or self._process.stderr is None:
            return ""
        return self._process.stderr.read().decode(errors="replace")

    def close(self) -> int:
        """Send Shutdown (no reply), close the socket, wait; the proxy's exit status."""
        with contextlib.suppress(OSError):
            self._sock.send(json.dumps({"method": "Shutdown", "args": []}).encode())
        self._sock.close()
        try:
            return self._process.wait(timeout=30)
        finally:
            if self._process.stderr is not None:
                self._process.stderr.close()

    def __enter__(self) -> ImageProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._process.poll() is None:
            self.close()

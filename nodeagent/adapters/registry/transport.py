"""The registry client's HTTP transport: one GET on a fresh connection, in a worker thread.

``http.client`` in a worker thread (``asyncio.to_thread``), one connection per
request: correct HTTP/1.1 framing (chunked bodies) and TLS with hostname checks
from the standard library, where asyncio streams would need a hand-written HTTP
parser. Admission fetches two or three small documents per image, so a thread
per request costs nothing that matters. ``timeout_s`` bounds the connect and
every socket read; a cancelled caller stops waiting at once and its thread ends
within ``timeout_s``.

A body is read into memory up to ``MAX_MANIFEST_BYTES`` (and one byte more, so
that the caller sees it was larger); a ``Sink`` takes a 200 body of any size,
hashing and counting it on the way.
"""

from __future__ import annotations

import hashlib
import http.client
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from nodeagent import __version__
from nodeagent.errors import HostFileError

MAX_MANIFEST_BYTES: Final = 4 * 1024 * 1024
"""Larger manifest bodies are refused (containers-image uses the same limit)."""

DOWNLOAD_CHUNK_BYTES: Final = 1 << 20
"""A ``Sink`` reads and writes bodies in pieces of this size."""

_USER_AGENT: Final = f"nodeagent/{__version__}"


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    """Lower-case names."""
    body: bytes


class Writable(Protocol):
    def write(self, data: bytes, /) -> object: ...


def exchange(
    url: str,
    headers: Mapping[str, str],
    timeout_s: float,
    context: ssl.SSLContext | None,
    sink: Sink | None = None,
) -> Response:
    """GET ``url`` on a fresh connection (blocking: runs in a worker thread).

    With a ``sink``, a 200 body goes there instead of into the response.
    """
    parts = urllib.parse.urlsplit(url)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.netloc, timeout=timeout_s, context=context)
    else:
        conn = http.client.HTTPConnection(parts.netloc, timeout=timeout_s)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("GET", target, headers={"User-Agent": _USER_AGENT, **headers})
        response = conn.getresponse()
        lowered = {name.lower(): value for name, value in response.getheaders()}
        if sink is not None and response.status == 200:
            sink.fill(response)
            return Response(response.status, lowered, b"")
        body = response.read(MAX_MANIFEST_BYTES + 1)
        return Response(response.status, lowered, body)
    finally:
        conn.close()


class Sink:
    """Receives a 200 body in a worker thread: hashes, counts and writes it, up to a bound."""

    def __init__(
        self, target: Writable, max_bytes: int, on_bytes: Callable[[int], None] | None
    ) -> None:
        self.target = target
        self.max_bytes = max_bytes
        self.on_bytes = on_bytes
        self.sha256 = hashlib.sha256()
        self.size_bytes = 0
        self.stopped = threading.Event()
        """Set when the caller stopped waiting: the thread stops at the next chunk."""

    def fill(self, response: http.client.HTTPResponse) -> None:
        while self.size_bytes <= self.max_bytes and not self.stopped.is_set():
            chunk = response.read(min(DOWNLOAD_CHUNK_BYTES, self.max_bytes + 1 - self.size_bytes))
            if not chunk:
                return
            self.sha256.update(chunk)
            self.size_bytes += len(chunk)
            try:
                self.target.write(chunk)
            except OSError as err:  # not the network's fault: keep it out of RegistryUnavailable
                where = getattr(self.target, "name", "the download target")
                raise HostFileError(f"cannot write {where}: {err.strerror or err}") from err
            if self.on_bytes is not None:
                self.on_bytes(len(chunk))

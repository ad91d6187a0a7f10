"""A read-only OCI distribution server on loopback serving only a bundle's listed blobs.

CRI-O imports a bundle by pulling each image by its original name through a
registries.conf mirror pointing here (``nodeagent.bundles.mirror``): the runtime checks
every digest itself and stores the images under their real names.

Protocol: what a pull needs, HTTP/1.1 keep-alive, stdlib only (``nodeagent.bundles.mirror.route``).
The only lookup is digest → ``ExpectedFile`` in the allow-list of the verified
bundle manifest (``served_blobs``), whatever the repository name: no part of a
URL is ever a path. Files are opened beneath the root one component at a time
with ``O_NOFOLLOW`` (``BundleDir``), must be regular and of the listed size.
Binds 127.0.0.1 only. A non-HTTP first byte (the TLS ClientHello that
containers-image sends before falling back to plain HTTP) is answered 400 at
once; waiting for more would cost each ping a 10 s TLS handshake timeout.

A blob is hashed while it is sent, its last chunk held back until the digest
matched (``nodeagent.adapters.bundles.streamer``, with the measurements behind
that choice). Blobs of one chunk and ranges of unverified blobs are hashed whole
first. Verified and rejected blobs are remembered: one is re-sent without
hashing, the other reported once (``rejections``, ``on_rejected``, event
``bundle_blob_rejected``) and answered 404, also to the ranged retry
containers-image makes after a cut body. Concurrent first requests for one blob
may hash it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Final

import structlog

from nodeagent.adapters.bundles.streamer import (
    DEFAULT_CHUNK_BYTES,
    AbortConnection,
    Blob,
    BlobStreamer,
    in_thread,
)
from nodeagent.adapters.bundles.tree import BundleDir
from nodeagent.bundles.manifest import BundleError, ExpectedFile, check_digest
from nodeagent.bundles.mirror import (
    API_VERSION_HEADER,
    ErrorAnswer,
    RangeNotSatisfiable,
    Request,
    RequestInvalid,
    ServedCounters,
    content_range,
    manifest_media_type,
    parse_range,
    parse_request_head,
    response_head,
    route,
)
from nodeagent.errors import HostFileError

log = structlog.get_logger(__name__)

LOOPBACK: Final = "127.0.0.1"
"""The only address the server binds: the mirror is plain HTTP."""
MAX_MANIFEST_BYTES: Final = 4 << 20
"""Larger blobs are never served as manifests (distribution's own limit)."""
MAX_HEAD_BYTES: Final = 16 << 10
"""Request line plus headers; longer requests are dropped."""
IO_TIMEOUT_S: Final = 60.0
"""Idle keep-alive connections and a chunk's send that make no progress end after this."""

_CLOSING: Final = Request("GET", "/", {}, keep_alive=False)


_CONNECTION_ENDS: Final = (
    AbortConnection,
    ConnectionError,
    TimeoutError,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
    asyncio.CancelledError,
)


# ------------------------------------------------------------------ files (blocking)
def _read_small(media: BundleDir, file: ExpectedFile) -> bytes:
    with media.open_file(file) as stream:
        data = os.pread(stream.fileno(), file.size_bytes, 0)
    check_digest(file, hashlib.sha256(data).hexdigest())
    return data


# ------------------------------------------------------------------ the server
@dataclass(slots=True)
class _Exchange:
    """One request and the connection it is answered on."""

    request: Request
    writer: asyncio.StreamWriter

    @property
    def is_get(self) -> bool:
        return self.request.method == "GET"

    def start(self, status: int, headers: Mapping[str, str], length_bytes: int) -> None:
        fields = {**API_VERSION_HEADER, **headers, "Content-Length": str(length_bytes)}
        if not self.request.keep_alive:
            fields["Connection"] = "close"
        self.writer.write(response_head(status, fields))

    async def send(self, status: int, headers: Mapping[str, str], body: bytes = b"") -> None:
        self.start(status, headers, len(body))
        if self.request.method != "HEAD":
            self.writer.write(body)
        await self.writer.drain()

    async def error(self, answer: ErrorAnswer) -> None:
        fields = {"Content-Type": "application/json", **answer.headers}
        await self.send(answer.status, fields, answer.body())


class BundleServer:
    """Serve ``blobs`` (digest → file under ``root``) on ``127.0.0.1:port`` until closed."""

    def __init__(
        self,
        root: Path,
        blobs: Mapping[str, ExpectedFile],
        *,
        port: int = 0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        on_rejected: Callable[[BundleError], None] | None = None,
    ) -> None:
        self.root, self._blobs, self._port = root, dict(blobs), port
        self._on_rejected = on_rejected
        self._streamer = BlobStreamer(
            chunk_bytes=chunk_bytes,
            send_timeout_s=IO_TIMEOUT_S,
            on_verified=self._mark_verified,
            on_rejected=self._reject,
            on_sent=lambda count: self._count(bytes_served=count),
        )
        self._verified: set[str] = set()
        self._rejected: dict[str, BundleError] = {}
        self._manifests: dict[str, tuple[bytes, str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._media: BundleDir | None = None
        self._responding = 0
        self._settled = asyncio.Event()
        self._settled.set()
        self.counters = ServedCounters()
        """Updated as requests are served (a new frozen value each time)."""

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("bundle server not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def mirror_host(self) -> str:
        """``127.0.0.1:<port>``: the mirror location's host part for registries.conf."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def rejections(self) -> tuple[BundleError, ...]:
        return tuple(self._rejected.values())

    async def start(self) -> None:
        self._media = BundleDir(self.root)
        self._server = await asyncio.start_server(
            self._serve_connection, LOOPBACK, self._port, limit=MAX_HEAD_BYTES
        )
        log.info("bundle_server_started", address=self.mirror_host, blobs=len(self._blobs))

    async def settled(self) -> None:
        """Wait until no response is in progress (idle keep-alive connections do not count).

        A runtime that drops a damaged blob's connection early gets its error
        before the server has finished that blob's digest: read ``rejections``
        after this (``close`` waits for it too).
        """
        await self._settled.wait()

    async def close(self, *, grace_s: float = 10.0) -> None:
        """Stop accepting, let responses in progress end (up to ``grace_s``), drop the rest."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await self.settled()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None
            log.info("bundle_server_stopped", bytes=self.counters.bytes_served)
        if self._media is not None:
            self._media.close()
            self._media = None

    async def __aenter__(self) -> BundleServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _count(self, **increments: int) -> None:
        now = self.counters
        self.counters = replace(now, **{k: getattr(now, k) + v for k, v in increments.items()})

    # -------------------------------------------------------------- connections
    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while await self._serve_one(reader, writer):
                pass
            writer.close()
        except _CONNECTION_ENDS:
            writer.transport.abort()
        except (OSError, HostFileError) as err:
            log.warning("bundle_read_failed", error=str(err))
            writer.transport.abort()
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        async with asyncio.timeout(IO_TIMEOUT_S):
            head = await reader.read(1)
            if not head:
                return False
            if head.isalpha():  # anything else (a TLS ClientHello) is answered at once
                head += await reader.readuntil(b"\r\n\r\n")
        self._count(requests=1)
        self._responding += 1
        self._settled.clear()
        try:
            return await self._respond(head, writer)
        finally:
            self._responding -= 1
            if not self._responding:
                self._settled.set()

    async def _respond(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        try:
            request = parse_request_head(head)
        except RequestInvalid as err:
            await _Exchange(_CLOSING, writer).error(ErrorAnswer(400, "UNSUPPORTED", str(err)))
            return False
        await self._route(_Exchange(request, writer))
        return request.keep_alive

    async def _route(self, ex: _Exchange) -> None:
        target = route(ex.request)
        if isinstance(target, ErrorAnswer):
            await ex.error(target)
        elif target.kind == "base":
            await ex.send(200, {"Content-Type": "application/json"}, b"{}")
        elif target.kind == "manifests":
            await self._serve_manifest(ex, target.digest)
        else:
            await self._serve_blob(ex, target.digest)

    # -------------------------------------------------------------- content
    def _reject(self, digest: str, error: BundleError) -> None:
        if digest not in self._rejected:
            self._rejected[digest] = error
            log.error("bundle_blob_rejected", digest=digest, reason=error.reason, error=str(error))
            if self._on_rejected is not None:
                self._on_rejected(error)

    def _listed(self, digest: str) -> ExpectedFile | None:
        return None if digest in self._rejected else self._blobs.get(digest)

    def _mark_verified(self, digest: str, size_bytes: int) -> None:
        self._verified.add(digest)
        self._count(bytes_hashed=size_bytes)

    async def _load_manifest(self, digest: str) -> tuple[bytes, str] | None:
        file = self._listed(digest)
        if digest in self._manifests or file is None or file.size_bytes > MAX_MANIFEST_BYTES:
            return self._manifests.get(digest)
        try:
            body = await in_thread(_read_small, self._opened_media(), file)
        except BundleError as err:
            self._reject(digest, err)
            return None
        self._mark_verified(digest, len(body))
        media_type = manifest_media_type(body)
        if media_type is not None:
            self._manifests[digest] = (body, media_type)
        return self._manifests.get(digest)

    def _opened_media(self) -> BundleDir:
        if self._media is None:
            raise RuntimeError("bundle server not started")
        return self._media

    async def _serve_manifest(self, ex: _Exchange, digest: str) -> None:
        loaded = await self._load_manifest(digest)
        if loaded is None:
            await ex.error(ErrorAnswer(404, "MANIFEST_UNKNOWN", f"no manifest {digest}"))
            return
        body, media_type = loaded
        await ex.send(200, {"Content-Type": media_type, "Docker-Content-Digest": digest}, body)
        if ex.is_get:
            self._count(manifests_served=1, bytes_served=len(body))

    async def _serve_blob(self, ex: _Exchange, digest: str) -> None:
        file = self._listed(digest)
        stream = None if file is None else await self._open(digest, file)
        if file is None or stream is None:
            await ex.error(ErrorAnswer(404, "BLOB_UNKNOWN", f"no blob {digest}"))
            return
        with stream:
            await self._send_blob(ex, Blob(digest, file, stream))

    async def _open(self, digest: str, file: ExpectedFile) -> IO[bytes] | None:
        try:
            return await in_thread(self._opened_media().open_file, file)
        except BundleError as err:
            self._reject(digest, err)
            return None

    async def _send_blob(self, ex: _Exchange, blob: Blob) -> None:
        size = blob.file.size_bytes
        try:
            span = parse_range(ex.request.headers.get("range"), size)
        except RangeNotSatisfiable:
            unsatisfiable = content_range(size, None)
            await ex.error(ErrorAnswer(416, "BLOB_UNKNOWN", "range not satisfiable", unsatisfiable))
            return
        start, end = span or (0, size)
        is_small = span is not None or size <= self._streamer.chunk_bytes
        must_verify = ex.is_get and is_small and blob.digest not in self._verified
        if must_verify and not await self._streamer.verify(blob):
            await ex.error(ErrorAnswer(404, "BLOB_UNKNOWN", f"blob {blob.digest} is damaged"))
            return
        headers = {"Content-Type": "application/octet-stream", "Docker-Content-Digest": blob.digest}
        headers |= {"Accept-Ranges": "bytes"} | (content_range(size, span) if span else {})
        ex.start(206 if span else 200, headers, end - start)
        if not ex.is_get:
            await ex.writer.drain()
            return
        if blob.digest in self._verified:
            await self._streamer.send_range(ex.writer, blob, start, end)
        else:
            await self._streamer.send_verifying(ex.writer, blob)
        self._count(blobs_served=0 if span else 1)

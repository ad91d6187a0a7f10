"""Manifests and blobs by digest from an allow-list: what both servers answer with content.

The only lookup is digest → ``ExpectedFile`` (``lookup``): the verified bundle manifest's
blobs for the loopback mirror, the store's records for the peer server. No part of a URL
is ever a path. Files are opened beneath the root one component at a time with
``O_NOFOLLOW`` (``BundleDir``), must be regular and of the listed size.

A blob is hashed while it is sent, its last chunk held back until the digest matched
(``nodeagent.adapters.http.streamer``, with the measurements behind that choice). Blobs
of one chunk and ranges of unverified blobs are hashed whole first. Verified and rejected
blobs are remembered: one is re-sent without hashing, the other reported once
(``rejections``, ``on_rejected``) and answered 404, also to the ranged retry
containers-image makes after a cut body. Concurrent first requests for one blob may hash
it twice. A blob asked for as a manifest is read, hashed and parsed once per version of its
file, whether it is a manifest or not (``nodeagent.adapters.http.verdicts``).

With ``arrival_wait_s`` (the loopback mirror of an import whose store copy still runs,
decision 0079), a listed file that is not there yet is looked for again every
``ARRIVAL_POLL_S`` until it is, for up to that long; then it is refused as missing. Only a
file that is absent waits: one that is there but wrong is refused at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Set
from dataclasses import replace
from pathlib import Path
from typing import IO, Final, TypeVar

import structlog
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from nodeagent.adapters.bundles.tree import BundleDir, FileStamp, file_stamp
from nodeagent.adapters.http.streamer import (
    AbortConnection,
    Blob,
    BlobStreamer,
    Outlet,
    in_thread,
)
from nodeagent.adapters.http.verdicts import ManifestVerdicts, Verdict
from nodeagent.bundles.manifest import BundleError, BundleIncomplete, ExpectedFile
from nodeagent.bundles.mirror import (
    API_VERSION_HEADER,
    ErrorAnswer,
    RangeNotSatisfiable,
    ServedCounters,
    content_range,
    manifest_media_type,
    parse_range,
)
from nodeagent.bundles.tree_rules import check_digest
from nodeagent.errors import HostFileError

log = structlog.get_logger(__name__)

MAX_MANIFEST_BYTES: Final = 4 << 20
"""Larger blobs are never served as manifests (distribution's own limit)."""
ARRIVAL_POLL_S: Final = 0.1
"""How often a listed file not there yet is looked for (``arrival_wait_s``)."""

T = TypeVar("T")


def _open_stamped(media: BundleDir, file: ExpectedFile) -> tuple[IO[bytes], FileStamp]:
    stream = media.open_file(file)
    return stream, file_stamp(stream.fileno())


def _judge(stream: IO[bytes], file: ExpectedFile) -> tuple[bytes, str | None]:
    """The body of a small listed blob, checked against its digest, and its media type if it
    is a manifest (the parse of up to 4 MiB of JSON runs here, in a worker thread)."""
    data = os.pread(stream.fileno(), file.size_bytes, 0)
    check_digest(file, hashlib.sha256(data).hexdigest())
    return data, manifest_media_type(data)


async def answer(
    request: BaseRequest,
    status: int,
    headers: Mapping[str, str],
    body: bytes = b"",
    *,
    timeout_s: float,
) -> StreamResponse:
    """A whole response (HEAD: its head only), sent within ``timeout_s``."""
    response = StreamResponse(status=status, headers={**API_VERSION_HEADER, **headers})
    response.content_length = len(body)
    async with asyncio.timeout(timeout_s):
        await response.prepare(request)
        if request.method != "HEAD" and body:
            await response.write(body)
        await response.write_eof()
    return response


async def error(request: BaseRequest, err: ErrorAnswer, *, timeout_s: float) -> StreamResponse:
    """A distribution error answer (JSON body)."""
    headers = {"Content-Type": "application/json", **err.headers}
    return await answer(request, err.status, headers, err.body(), timeout_s=timeout_s)


def _transport(request: BaseRequest) -> asyncio.Transport:
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client closed the connection")
    return transport


class ServedContent:
    """Answers manifest and blob requests for the digests ``lookup`` lists, from ``root``."""

    def __init__(
        self,
        root: Path,
        lookup: Callable[[str], ExpectedFile | None],
        *,
        chunk_bytes: int,
        io_timeout_s: float,
        on_rejected: Callable[[str, BundleError], None],
        pace: Callable[[int], Awaitable[None]] | None = None,
        step_bytes: int | None = None,
        arrival_wait_s: float = 0.0,
    ) -> None:
        self.root, self._lookup, self._io_timeout_s = root, lookup, io_timeout_s
        self._arrival_wait_s = arrival_wait_s
        self._on_rejected = on_rejected
        self._streamer = BlobStreamer(
            chunk_bytes=chunk_bytes,
            send_timeout_s=io_timeout_s,
            on_verified=self._mark_verified,
            on_rejected=self._reject,
            on_sent=lambda count: self.count(bytes_served=count),
            pace=pace,
            step_bytes=step_bytes,
        )
        self._verified: set[str] = set()
        self._rejected: dict[str, BundleError] = {}
        self._verdicts = ManifestVerdicts()
        self._media: BundleDir | None = None
        self.counters = ServedCounters()
        """Updated as requests are served (a new frozen value each time)."""

    @property
    def rejections(self) -> tuple[BundleError, ...]:
        return tuple(self._rejected.values())

    def open(self) -> None:
        self._media = BundleDir(self.root)

    def close(self) -> None:
        if self._media is not None:
            self._media.close()
            self._media = None

    def count(self, **increments: int) -> None:
        now = self.counters
        self.counters = replace(now, **{k: getattr(now, k) + v for k, v in increments.items()})

    def forget_verdicts(self, keep: Set[str]) -> None:
        """The files changed (the peer server's store): forget every rejection (a blob found
        damaged may have been stored again since) and the verdicts of digests not in
        ``keep``. Stored blobs are immutable, so those still offered stay verified."""
        self._rejected.clear()
        self._verified &= keep
        self._verdicts.keep_only(keep)

    def listed(self, digest: str) -> ExpectedFile | None:
        """The file of a digest that is served: listed, and not found damaged."""
        return None if digest in self._rejected else self._lookup(digest)

    # -------------------------------------------------------------- verdicts
    def _reject(self, digest: str, err: BundleError) -> None:
        if digest not in self._rejected:
            self._rejected[digest] = err
            self._on_rejected(digest, err)

    def _mark_verified(self, digest: str, size_bytes: int) -> None:
        self._verified.add(digest)
        self.count(bytes_hashed=size_bytes)

    def _opened_media(self) -> BundleDir:
        if self._media is None:
            raise RuntimeError("server not started")
        return self._media

    async def serve(self, request: BaseRequest, kind: str, digest: str) -> StreamResponse:
        """Answer a manifest (``kind`` "manifests") or blob fetch; a read error ends the
        connection (logged) rather than sending what could not be read."""
        try:
            if kind == "manifests":
                return await self.manifest(request, digest)
            return await self.blob(request, digest)
        except (ConnectionError, TimeoutError):
            pass
        except (OSError, HostFileError) as err:
            log.warning("blob_read_failed", digest=digest, error=str(err))
        if request.transport is not None:
            request.transport.abort()
        return StreamResponse()  # aiohttp finds the connection gone and ends it

    # -------------------------------------------------------------- manifests
    async def load_manifest(self, digest: str) -> tuple[bytes, str] | None:
        """The body and media type of a listed manifest. Each blob asked for as a manifest is
        read, hashed and parsed once per version of its file (``ManifestVerdicts``)."""
        file = self.listed(digest)
        if file is None or file.size_bytes > MAX_MANIFEST_BYTES:
            return None
        media = self._opened_media()
        try:
            stream, stamp = await self._once_there(lambda: _open_stamped(media, file))
        except BundleError as err:
            self._reject(digest, err)
            return None
        with stream:
            verdict = self._verdicts.get(digest, stamp)
            if verdict is None:
                verdict = await self._judge(digest, file, stream, stamp)
        if verdict is None or verdict.body is None or verdict.media_type is None:
            return None
        return verdict.body, verdict.media_type

    async def _judge(
        self, digest: str, file: ExpectedFile, stream: IO[bytes], stamp: FileStamp
    ) -> Verdict | None:
        try:
            body, media_type = await in_thread(_judge, stream, file)
        except BundleError as err:
            self._reject(digest, err)
            return None
        self._mark_verified(digest, len(body))
        verdict = Verdict(stamp, body if media_type else None, media_type)
        self._verdicts.put(digest, verdict)
        return verdict

    async def manifest(self, request: BaseRequest, digest: str) -> StreamResponse:
        loaded = await self.load_manifest(digest)
        if loaded is None:
            err = ErrorAnswer(404, "MANIFEST_UNKNOWN", f"no manifest {digest}")
            return await error(request, err, timeout_s=self._io_timeout_s)
        body, media_type = loaded
        headers = {"Content-Type": media_type, "Docker-Content-Digest": digest}
        response = await answer(request, 200, headers, body, timeout_s=self._io_timeout_s)
        if request.method == "GET":
            self.count(manifests_served=1, bytes_served=len(body))
        return response

    # -------------------------------------------------------------- blobs
    async def blob(self, request: BaseRequest, digest: str) -> StreamResponse:
        file = self.listed(digest)
        stream = None if file is None else await self._open(digest, file)
        if file is None or stream is None:
            err = ErrorAnswer(404, "BLOB_UNKNOWN", f"no blob {digest}")
            return await error(request, err, timeout_s=self._io_timeout_s)
        with stream:
            return await self._send_blob(request, Blob(digest, file, stream))

    async def _open(self, digest: str, file: ExpectedFile) -> IO[bytes] | None:
        media = self._opened_media()
        try:
            return await self._once_there(lambda: media.open_file(file))
        except BundleError as err:
            self._reject(digest, err)
            return None

    async def _once_there(self, open_file: Callable[[], T]) -> T:
        """``open_file()`` in a thread; while it finds the file absent, again every
        ``ARRIVAL_POLL_S`` for up to ``arrival_wait_s`` (then its ``BundleIncomplete``)."""
        deadline = time.monotonic() + self._arrival_wait_s
        while True:
            try:
                return await in_thread(open_file)
            except BundleIncomplete:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(ARRIVAL_POLL_S)

    async def _send_blob(self, request: BaseRequest, blob: Blob) -> StreamResponse:
        size, is_get = blob.file.size_bytes, request.method == "GET"
        try:
            span = parse_range(request.headers.get("Range"), size)
        except RangeNotSatisfiable:
            unsatisfiable = content_range(size, None)
            err = ErrorAnswer(416, "BLOB_UNKNOWN", "range not satisfiable", unsatisfiable)
            return await error(request, err, timeout_s=self._io_timeout_s)
        start, end = span or (0, size)
        is_small = span is not None or size <= self._streamer.chunk_bytes
        must_verify = is_get and is_small and blob.digest not in self._verified
        if must_verify and not await self._streamer.verify(blob):
            err = ErrorAnswer(404, "BLOB_UNKNOWN", f"blob {blob.digest} is damaged")
            return await error(request, err, timeout_s=self._io_timeout_s)
        headers = {"Content-Type": "application/octet-stream", "Docker-Content-Digest": blob.digest}
        headers |= {"Accept-Ranges": "bytes"} | (content_range(size, span) if span else {})
        response = StreamResponse(status=206 if span else 200, headers=API_VERSION_HEADER)
        response.headers.update(headers)
        response.content_length = end - start
        async with asyncio.timeout(self._io_timeout_s):
            await response.prepare(request)
        if not is_get:
            await response.write_eof()
            return response
        try:
            await self._send_body(request, response, blob, start, end)
        except (AbortConnection, ConnectionError, TimeoutError):
            if request.transport is not None:
                request.transport.abort()  # the client never gets a damaged blob whole
            return response  # aiohttp sees the connection gone and ends it
        await response.write_eof()
        self.count(blobs_served=0 if span else 1)
        return response

    async def _send_body(
        self, request: BaseRequest, response: StreamResponse, blob: Blob, start: int, end: int
    ) -> None:
        out = Outlet(response, _transport(request))
        if blob.digest in self._verified:
            await self._streamer.send_range(out, blob, start, end)
        else:
            await self._streamer.send_verifying(out, blob)

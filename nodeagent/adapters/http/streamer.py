"""Sending a blob over HTTP while hashing it: the body pipeline of both servers.

Bodies go out under the aiohttp response whose head was sent (``StreamResponse.prepare``):
on plain TCP (the loopback mirror) by ``loop.sendfile`` on its transport, zero-copy; under
TLS (the peer server) in writes of ``TLS_WRITE_BYTES`` read by ``pread`` in a worker
thread, through ``StreamResponse.write`` (aiohttp's flow control). asyncio's own sendfile
fallback for TLS reads 16 KiB at a time, each read a worker-thread round trip: measured,
it cost the peer server 14 CPU-s per GB sent (bench/fanout, 8 nodes on 2 cores, where the
daemons' CPU then bounded the fan-out); see docs/performance.md.

Hashing and sending (measured: 500 MB blob, loopback, curl, warm cache; sha256
alone ~1450 MB/s): plain sendfile ~2500 MB/s; (a) hash all, then sendfile ~930
(first byte only after the whole blob, and a second media read if the page
cache drops it); (b) pread + hash + write ~900 (no zero-copy); (c) **chosen**,
pipelined: chunk *i+1* is hashed (pread, worker thread) while chunk *i* goes out
by ``sendfile`` from the pages hashing just read, ~1100-1150 with 16 MiB
chunks: one media read, bounded memory. The same with mmap reached ~1230 but a
medium pulled out mid-read would SIGBUS the daemon where pread raises EIO.

The last chunk is sent only once the whole digest matched; on a mismatch the
connection is aborted short of it (``AbortConnection``), so the runtime never
has the blob whole. If the client leaves first (CRI-O stops at corrupt gzip),
the digest is finished anyway. Every finished digest is reported as a verdict,
verified or rejected; what the server does with verdicts is its own business
(``nodeagent.adapters.http.content``).

An optional ``pace(count)`` is awaited before each send step of at most ``step_bytes``: the
peer server's upload bandwidth cap.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Final, TypeVar

from aiohttp.web_response import StreamResponse

from nodeagent.bundles.manifest import BundleError, BundleIncomplete, ExpectedFile
from nodeagent.bundles.tree_rules import check_digest

_T = TypeVar("_T")

DEFAULT_CHUNK_BYTES: Final = 16 << 20
"""Hash/send pipeline step (16 MiB measured best of 1/4/16 MiB)."""
TLS_WRITE_BYTES: Final = 1 << 20
"""One read and one write of a body under TLS (memory per upload: about twice this)."""


@dataclass(frozen=True, slots=True)
class Outlet:
    """Where a body goes: the response whose head was sent, and its connection."""

    response: StreamResponse
    transport: asyncio.Transport

    @property
    def is_tls(self) -> bool:
        return self.transport.get_extra_info("sslcontext") is not None


class AbortConnection(Exception):
    """End the connection without completing the response (a blob failed its digest)."""


@dataclass(slots=True)
class Blob:
    """A listed blob, opened beneath the bundle's root."""

    digest: str
    file: ExpectedFile
    stream: IO[bytes]


HASH_READ_BYTES: Final = 1 << 20
"""One read of the hash: a chunk is read and hashed in pieces of this size into one buffer
per blob sent, so the server's memory does not follow the chunk size. Reading 16 MiB at a
time allocated a new 16 MiB object per read, in as many threads as blobs in flight: the
allocator kept them, and the session server's peak RSS grew with the release's blob sizes
(93 MiB at 0.25 GiB, 143 MiB at 2 GiB: docs/performance.md, "Release scale")."""


@dataclass(slots=True)
class _Digesting:
    """The sha256 of a blob's first ``done_bytes``, advanced a chunk at a time (in threads)."""

    fd: int
    size_bytes: int
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256)
    done_bytes: int = 0
    buffer: bytearray = field(default_factory=lambda: bytearray(HASH_READ_BYTES))

    def advance(self, count: int) -> None:
        end = self.done_bytes + min(count, self.size_bytes - self.done_bytes)
        view = memoryview(self.buffer)
        while self.done_bytes < end:
            want = min(len(view), end - self.done_bytes)
            got = os.preadv(self.fd, [view[:want]], self.done_bytes)
            if got <= 0:
                raise BundleIncomplete(f"blob shrank while being read (at byte {self.done_bytes})")
            self.hasher.update(view[:got])
            self.done_bytes += got

    @property
    def is_done(self) -> bool:
        return self.done_bytes == self.size_bytes


async def in_thread(function: Callable[..., _T], *args: object) -> _T:
    """``asyncio.to_thread`` that, even when cancelled, returns only once the thread ended.

    The caller closes the files the thread reads when this returns, so a thread
    must never outlive it (its descriptor could be reused by then).
    """
    job = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await asyncio.wait([job])
        job.exception()  # retrieved: the cancellation is what propagates
        raise


class BlobStreamer:
    """Sends blobs by ``sendfile`` in steps of ``chunk_bytes``, verifying those not yet verified.

    ``send_timeout_s``: a step's send that makes no progress for this long ends the connection.
    ``on_verified(digest, size_bytes)`` and ``on_rejected(digest, error)``: the verdict of each
    digest finished here. ``on_sent(n)``: body bytes that went out.
    """

    def __init__(
        self,
        *,
        chunk_bytes: int,
        send_timeout_s: float,
        on_verified: Callable[[str, int], None],
        on_rejected: Callable[[str, BundleError], None],
        on_sent: Callable[[int], None],
        pace: Callable[[int], Awaitable[None]] | None = None,
        step_bytes: int | None = None,
    ) -> None:
        self.chunk_bytes = chunk_bytes
        self._pace = pace
        self._step_bytes = step_bytes or chunk_bytes
        self._send_timeout_s = send_timeout_s
        self._on_verified, self._on_rejected, self._on_sent = on_verified, on_rejected, on_sent

    async def verify(self, blob: Blob) -> bool:
        """Hash the whole blob and report its verdict (before a one-chunk blob or a range)."""
        return await self._finish_digest(
            blob, _Digesting(blob.stream.fileno(), blob.file.size_bytes)
        )

    async def send_range(self, out: Outlet, blob: Blob, start: int, end: int) -> None:
        """Send bytes ``start`` to ``end`` of a blob as they are (verified already)."""
        for offset in range(start, end, self.chunk_bytes):
            await self._send(out, blob, offset, min(self.chunk_bytes, end - offset))

    async def send_verifying(self, out: Outlet, blob: Blob) -> None:
        """Hash the next chunk while this one is sent; the last goes only if the digest matched."""
        size, chunk = blob.file.size_bytes, self.chunk_bytes
        digesting = _Digesting(blob.stream.fileno(), size)
        try:
            await in_thread(digesting.advance, chunk)
            for offset in range(0, size - chunk, chunk):
                await self._send_while_hashing(out, blob, digesting, offset)
        except (ConnectionError, TimeoutError):
            await self._finish_digest(blob, digesting)  # the client left (a runtime that found
            raise  # corrupt gzip does): damage is still reported, a retry not hashed again
        except BundleError as err:
            self._on_rejected(blob.digest, err)
            raise AbortConnection from err
        if not await self._finish_digest(blob, digesting):
            raise AbortConnection
        last = (size - 1) // chunk * chunk
        await self._send(out, blob, last, size - last)

    async def _finish_digest(self, blob: Blob, digesting: _Digesting) -> bool:
        """Hash what is left, compare, and report the blob as verified or rejected."""
        try:
            while not digesting.is_done:
                await in_thread(digesting.advance, self.chunk_bytes)
            check_digest(blob.file, digesting.hasher.hexdigest())
        except BundleError as err:
            self._on_rejected(blob.digest, err)
            return False
        self._on_verified(blob.digest, blob.file.size_bytes)
        return True

    async def _send(self, out: Outlet, blob: Blob, offset: int, count: int) -> None:
        loop = asyncio.get_running_loop()
        step_bytes = min(self._step_bytes, TLS_WRITE_BYTES) if out.is_tls else self._step_bytes
        for start in range(offset, offset + count, step_bytes):
            step = min(step_bytes, offset + count - start)
            if self._pace is not None:
                await self._pace(step)
            if out.transport.is_closing():  # the peer left; loop.sendfile would raise
                raise ConnectionResetError("the client closed the connection")
            if out.is_tls:
                data = await in_thread(_read_at, blob.stream.fileno(), step, start)
                async with asyncio.timeout(self._send_timeout_s):
                    await out.response.write(data)
                sent = len(data)
            else:
                async with asyncio.timeout(self._send_timeout_s):
                    sent = await loop.sendfile(out.transport, blob.stream, start, step)
            self._on_sent(sent)

    async def _send_while_hashing(
        self, out: Outlet, blob: Blob, digesting: _Digesting, offset: int
    ) -> None:
        job = asyncio.ensure_future(asyncio.to_thread(digesting.advance, self.chunk_bytes))
        try:
            await self._send(out, blob, offset, self.chunk_bytes)
        finally:
            await asyncio.wait([job])  # never leave a thread reading a file about to be closed
            error = job.exception()
        if error is not None:
            raise error


def _read_at(fd: int, count: int, offset: int) -> bytes:
    """``count`` bytes at ``offset``, all of them (a file that shrank raises)."""
    data = os.pread(fd, count, offset)
    if len(data) != count:
        raise BundleIncomplete(f"blob shrank while being sent (at byte {offset + len(data)})")
    return data

"""The loopback mirror: a read-only OCI distribution server serving only a bundle's blobs.

CRI-O imports a bundle by pulling each image by its original name through a
registries.conf mirror pointing here (``nodeagent.bundles.mirror``): the runtime checks
every digest itself and stores the images under their real names.

Protocol: what a pull needs (``nodeagent.bundles.mirror.route``), HTTP/1.1 keep-alive on
aiohttp (``nodeagent.adapters.http.listener``: bounded heads, deadlines, a TLS ClientHello
answered 400 at once; at most ``CAPS`` connections at once). Binds 127.0.0.1 only: the
mirror is plain HTTP. The content, its allow-list, ``O_NOFOLLOW`` opens and the
hash-while-sending pipeline are ``nodeagent.adapters.http.content``'s; a rejected blob is logged
(``bundle_blob_rejected``) and reported once (``rejections``, ``on_rejected``).

It runs in a process of its own, one per mirror session (``nodeagent serve-session``,
``nodeagent.daemon.session``; decision 0064): the root daemon listens on no port.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import structlog
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from nodeagent.adapters.http.admission import Caps
from nodeagent.adapters.http.content import ServedContent, answer, error
from nodeagent.adapters.http.listener import Listener
from nodeagent.adapters.http.streamer import DEFAULT_CHUNK_BYTES
from nodeagent.bundles.manifest import BundleError, ExpectedFile
from nodeagent.bundles.mirror import ErrorAnswer, Request, ServedCounters, route

log = structlog.get_logger(__name__)

LOOPBACK: Final = "127.0.0.1"
"""The only address the server binds: the mirror is plain HTTP."""
IO_TIMEOUT_S: Final = 60.0
"""A first request, an idle keep-alive connection and a chunk's send end after this."""
CAPS: Final = Caps(max_connections=256, max_per_source=256)
"""Connections kept at once. Its only clients are local (CRI-O pulling ``[pull]
concurrency`` images, at most 64, each a few layers at once and connections kept alive),
all from 127.0.0.1, so one cap: a local process that opens many holds at most these, and
the daemon's descriptors stay far below its LimitNOFILE (docs/decisions/0052)."""


def as_request(request: BaseRequest) -> Request:
    """The routing view of an aiohttp request: method and raw path (never decoded)."""
    return Request(request.method, request.raw_path.partition("?")[0])


class BundleServer:
    """Serve ``blobs`` (digest → file under ``root``) on ``127.0.0.1:port`` until closed;
    ``tags``: the tags of a verified manifest, ``<repository>/<tag>`` → digest (its signature
    tags, ``signatures.served_tags``, and its served tags, ``tags.tag_names``), each answered
    with exactly its listed manifest (``Docker-Content-Digest`` that digest), the only tags
    ever served. ``arrival_wait_s``: how long a listed file that is not there yet is
    awaited (an import's store copy still running; decision 0079)."""

    def __init__(
        self,
        root: Path,
        blobs: Mapping[str, ExpectedFile],
        *,
        tags: Mapping[str, str] | None = None,
        port: int = 0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        arrival_wait_s: float = 0.0,
        on_rejected: Callable[[str, BundleError], None] | None = None,
    ) -> None:
        self.root, self._blobs, self._port = root, dict(blobs), port
        self._tags = {name: d for name, d in (tags or {}).items() if d in self._blobs}
        self._on_rejected = on_rejected
        self._content = ServedContent(
            root,
            self._blobs.get,
            chunk_bytes=chunk_bytes,
            io_timeout_s=IO_TIMEOUT_S,
            on_rejected=self._reject,
            arrival_wait_s=arrival_wait_s,
        )
        self._listener = Listener(self._answer, io_timeout_s=IO_TIMEOUT_S, caps=CAPS, name="mirror")
        self._started = False

    @property
    def port(self) -> int:
        if not self._started:
            raise RuntimeError("bundle server not started")
        return self._listener.port

    @property
    def mirror_host(self) -> str:
        """``127.0.0.1:<port>``: the mirror location's host part for registries.conf."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def counters(self) -> ServedCounters:
        """What has been served so far (a new frozen value each time)."""
        return self._content.counters

    @property
    def rejections(self) -> tuple[BundleError, ...]:
        return self._content.rejections

    async def start(self) -> None:
        self._content.open()
        await self._listener.start(LOOPBACK, self._port)
        self._started = True
        log.info("bundle_server_started", address=self.mirror_host, blobs=len(self._blobs))

    async def settled(self) -> None:
        """Wait until no response is in progress (idle keep-alive connections do not count).

        A runtime that drops a damaged blob's connection early gets its error
        before the server has finished that blob's digest: read ``rejections``
        after this (``close`` waits for it too).
        """
        await self._listener.settled()

    async def close(self, *, grace_s: float = 10.0) -> None:
        """Stop accepting, let responses in progress end (up to ``grace_s``), drop the rest."""
        if self._started:
            await self._listener.close(grace_s=grace_s)
            self._started = False
            log.info("bundle_server_stopped", bytes=self.counters.bytes_served)
        self._content.close()

    async def __aenter__(self) -> BundleServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _reject(self, digest: str, err: BundleError) -> None:
        log.error("bundle_blob_rejected", digest=digest, reason=err.reason, error=str(err))
        if self._on_rejected is not None:
            self._on_rejected(digest, err)

    async def _answer(self, request: BaseRequest) -> StreamResponse:
        self._content.count(requests=1)
        target = route(as_request(request))
        if isinstance(target, ErrorAnswer):
            return await error(request, target, timeout_s=IO_TIMEOUT_S)
        if target.kind == "base":
            headers = {"Content-Type": "application/json"}
            return await answer(request, 200, headers, b"{}", timeout_s=IO_TIMEOUT_S)
        if target.kind in ("signature", "tag"):
            listed = self._tags.get(target.name)
            if listed is None:
                unknown = ErrorAnswer(404, "MANIFEST_UNKNOWN", "no signed tag of that name")
                return await error(request, unknown, timeout_s=IO_TIMEOUT_S)
            return await self._content.serve(request, "manifests", listed)
        return await self._content.serve(request, target.kind, target.digest)

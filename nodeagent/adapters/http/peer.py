"""The peer server: the node's store, read only, to the site's other nodes (docs/site.md).

HTTPS with mutual TLS on ``[site] listen`` (``nodeagent.adapters.http.tls``: client
certificates required, chained to ``ca_file``; the server's certificate re-read when it is
rotated). Routing is ``nodeagent.site.routes``; manifests and blobs are served by
``nodeagent.adapters.http.content`` from the allow-list of the store's offer
(``nodeagent.adapters.store.offer``: stored blobs a bundle record lists, and the signature
tags its signed manifest lists), re-read when it is older than ``OFFER_TTL_S``; a release
bundle's signature files only by the names its stored manifest lists
(``release_files.ReleaseSignatureFiles``, which parses each ``bundle.json`` once per version
of the file). A stored
blob that fails its digest is never sent whole (the connection is cut before its last
chunk), is reported as ``StoreBlobCorrupt`` and handed, in a thread, to ``on_corrupt``
(the daemon passes the store's ``set_aside_corrupt``, which removes it as ``nodeagent
store verify`` would); the offer is then read again.

Bounds (``nodeagent.site.limits``): ``max_uploads`` blob downloads at once (503 beyond),
two per client certificate (429 beyond), both with ``Retry-After``; all uploads under
``upload_max_bytes`` per second when set; ``request_timeout_s`` for a first request, an
idle connection and each send step; bounded request heads; only GET and HEAD.
Connections (``nodeagent.adapters.http.admission``, ``peer_caps``): at most
``max_connections`` at once and ``max_connections_per_source`` from one address, from
``allow_from`` when it is set, each refused one closed as soon as it is accepted, before
any TLS object is built; a TLS handshake not done within ``handshake_timeout_s`` is cut.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from nodeagent.adapters.http.admission import Caps, Door, parse_networks
from nodeagent.adapters.http.content import ServedContent, answer, error
from nodeagent.adapters.http.listener import Listener
from nodeagent.adapters.http.streamer import in_thread
from nodeagent.adapters.http.tls import ReloadingTls
from nodeagent.adapters.store.offer import StoreOffer, read_offer
from nodeagent.adapters.store.records import read_bundle_file
from nodeagent.adapters.store.release_files import ReleaseSignatureFiles
from nodeagent.bundles.manifest import (
    BundleDigestMismatch,
    BundleError,
    BundleSizeMismatch,
    ExpectedFile,
)
from nodeagent.bundles.mirror import ErrorAnswer, ServedCounters
from nodeagent.config.site import SiteSettings
from nodeagent.errors import NodeAgentError, StoreBlobCorrupt
from nodeagent.site.holdings import Holdings, have_of, holding_of, render_have, render_holdings
from nodeagent.site.limits import RETRY_AFTER_S, TokenBucket, UploadSlots
from nodeagent.site.routes import PeerTarget, route_peer
from nodeagent.store import layout
from nodeagent.store.layout import MANIFEST_NAME
from nodeagent.strict import clip

log = structlog.get_logger(__name__)

OFFER_TTL_S: Final = 1.0
"""How long the store's offer is served before it is read again: a blob this node has just
fetched is offered on within a second (the offer is read only when asked, a listing of the
store and its small records)."""
CHUNK_BYTES: Final = 2 << 20
"""Hash/send step of the peer server: a blob served the first time is hashed a step ahead of
what is sent, so each upload holds about two steps and a 1 MiB TLS write. The loopback
mirror's 16 MiB (``streamer.DEFAULT_CHUNK_BYTES``, one client, plain TCP) would hold 32 MiB
per upload: bench/fanout measured daemons peaking at 250-350 MiB with 8 uploads."""
PACED_STEP_BYTES: Final = 64 << 10
"""Send step under a bandwidth cap (each step waits for its share)."""
_JSON: Final = {"Content-Type": "application/json"}
_OCTETS: Final = {"Content-Type": "application/octet-stream"}


def peer_caps(site: SiteSettings) -> Caps:
    """The peer server's connection caps from ``[site]`` (its values checked at load)."""
    networks = parse_networks(site.allow_from)
    return Caps(site.max_connections, site.max_connections_per_source, networks)


_DEFAULTS: Final = SiteSettings()


def _peer_of(request: BaseRequest) -> tuple[str, str]:
    """(key, name) of the client certificate: its sha256, and its subject CN for the log."""
    transport = request.transport
    tls = None if transport is None else transport.get_extra_info("ssl_object")
    der = None if tls is None else tls.getpeercert(binary_form=True)
    if tls is None or not der:
        return "", "(no certificate)"
    subject = dict(part[0] for part in tls.getpeercert().get("subject", ()))
    return hashlib.sha256(der).hexdigest(), clip(subject.get("commonName", "?"), 80)


class PeerServer:
    """Serves the store at ``store_root`` to peers on ``host:port`` until closed."""

    def __init__(
        self,
        store_root: Path,
        tls: ReloadingTls,
        *,
        node: str,
        host: str,
        port: int,
        max_uploads: int,
        upload_max_bytes: int,
        request_timeout_s: float,
        caps: Caps | None = None,
        handshake_timeout_s: float = _DEFAULTS.handshake_timeout_s,
        chunk_bytes: int = CHUNK_BYTES,
        offer_ttl_s: float = OFFER_TTL_S,
        on_corrupt: Callable[[str], object] | None = None,
    ) -> None:
        self.store_root, self._tls, self.node = store_root, tls, node
        self._host, self._port, self._timeout_s = host, port, request_timeout_s
        self._on_corrupt, self._offer_ttl_s = on_corrupt, offer_ttl_s
        self.slots = UploadSlots(max_uploads)
        self._bucket: TokenBucket | None = None
        self._upload_max_bytes = upload_max_bytes
        self._content = ServedContent(
            store_root,
            self._listed,
            chunk_bytes=chunk_bytes,
            io_timeout_s=request_timeout_s,
            on_rejected=self._reject,
            pace=self._pace if upload_max_bytes else None,
            step_bytes=PACED_STEP_BYTES if upload_max_bytes else None,
        )
        self._listener = Listener(
            self._answer,
            io_timeout_s=request_timeout_s,
            caps=caps or peer_caps(_DEFAULTS),
            name="peer",
            handshake_s=handshake_timeout_s,
        )
        self.release_files = ReleaseSignatureFiles(store_root)
        """Release signature files by listed path; each bundle.json parsed once per version."""
        self._offer = StoreOffer({}, {}, frozenset())
        self._offer_read_at: float | None = None
        self._offer_lock = asyncio.Lock()
        self._is_saturated = False
        self.corrupt: list[StoreBlobCorrupt] = []
        """Blobs found damaged while being served, in order."""
        self._setting_aside: dict[str, asyncio.Task[None]] = {}

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def counters(self) -> ServedCounters:
        return self._content.counters

    @property
    def door(self) -> Door:
        """The connections open now and those refused since start."""
        return self._listener.door

    @property
    def tls_built(self) -> int:
        """TLS protocols built since start (one per admitted connection)."""
        return self._listener.tls_built

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._upload_max_bytes:
            burst = max(PACED_STEP_BYTES, self._upload_max_bytes // 10)
            self._bucket = TokenBucket(self._upload_max_bytes, burst, loop.time())
        self._content.open()
        await self._listener.start(self._host, self._port, self._tls.context)
        offer = await self._current_offer()
        log.info(
            "peer_server_started",
            address=f"{self._host}:{self.port}",
            bundles=len(offer.bundles),
            blobs=len(offer.blobs),
            max_uploads=self.slots.max_uploads,
            upload_max_bytes=self._upload_max_bytes or "unlimited",
            max_connections=self.door.caps.max_connections,
            max_connections_per_source=self.door.caps.max_per_source,
        )

    async def close(self, *, grace_s: float = 10.0) -> None:
        await self._listener.close(grace_s=grace_s)
        if self._setting_aside:
            await asyncio.wait(list(self._setting_aside.values()))
        self._content.close()
        log.info("peer_server_stopped", bytes=self.counters.bytes_served)

    async def __aenter__(self) -> PeerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def settled(self) -> None:
        await self._listener.settled()

    # -------------------------------------------------------------- the store
    def _listed(self, digest: str) -> ExpectedFile | None:
        return self._offer.blobs.get(digest)

    async def _current_offer(self, *, max_age_s: float | None = None) -> StoreOffer:
        """The store's offer, read again when older than ``max_age_s`` (default: the TTL)."""
        loop = asyncio.get_running_loop()
        ttl_s = self._offer_ttl_s if max_age_s is None else min(max_age_s, self._offer_ttl_s)
        async with self._offer_lock:
            read_at = self._offer_read_at
            if read_at is None or loop.time() - read_at >= ttl_s:
                offer = await in_thread(read_offer, self.store_root, self._offer)
                if offer != self._offer:
                    self._content.forget_verdicts(offer.stored)
                self._offer, self._offer_read_at = offer, loop.time()
        return self._offer

    def _reject(self, digest: str, err: BundleError) -> None:
        if not isinstance(err, BundleDigestMismatch | BundleSizeMismatch):
            log.info("peer_blob_unavailable", digest=digest, error=str(err))
            return
        corrupt = StoreBlobCorrupt(f"stored blob {digest} is damaged: {err}")
        self.corrupt.append(corrupt)
        log.error("peer_blob_corrupt", digest=digest, reason=corrupt.reason, error=str(err))
        if self._on_corrupt is not None and digest not in self._setting_aside:
            set_aside = self._set_aside(self._on_corrupt, digest)
            task = asyncio.get_running_loop().create_task(set_aside)
            self._setting_aside[digest] = task

    async def _set_aside(self, on_corrupt: Callable[[str], object], digest: str) -> None:
        try:
            await in_thread(on_corrupt, digest)
        except NodeAgentError as err:  # the store could not be changed: the next send finds it
            log.error("peer_blob_not_set_aside", digest=digest, reason=err.reason, error=str(err))
        finally:
            del self._setting_aside[digest]
            self._offer_read_at = None  # no longer offered once removed

    async def _pace(self, count: int) -> None:
        if self._bucket is not None:
            wait_s = self._bucket.reserve(count, asyncio.get_running_loop().time())
            if wait_s > 0:
                await asyncio.sleep(wait_s)

    # -------------------------------------------------------------- requests
    async def _answer(self, request: BaseRequest) -> StreamResponse:
        self._content.count(requests=1)
        target = route_peer(request.method, request.raw_path.partition("?")[0])
        if isinstance(target, ErrorAnswer):
            return await error(request, target, timeout_s=self._timeout_s)
        offer = await self._current_offer()
        if target.kind == "blobs" and request.method == "GET":
            return await self._upload(request, target)
        if target.kind in ("manifests", "blobs"):
            return await self._content.serve(request, target.kind, target.digest)
        if target.kind in ("signature", "tag"):
            return await self._signature(request, target, offer)
        if target.kind == "base":
            return await answer(request, 200, _JSON, b"{}", timeout_s=self._timeout_s)
        return await self._own(request, target, offer)

    async def _signature(
        self, request: BaseRequest, target: PeerTarget, offer: StoreOffer
    ) -> StreamResponse:
        """A tag a stored bundle's signed manifest lists (a signature's, or one it serves):
        exactly its listed manifest."""
        listed = offer.tags.get(target.name)
        if listed is not None:
            return await self._content.serve(request, "manifests", listed)
        err = ErrorAnswer(404, "MANIFEST_UNKNOWN", "no signed tag of that name")
        return await error(request, err, timeout_s=self._timeout_s)

    async def _upload(self, request: BaseRequest, target: PeerTarget) -> StreamResponse:
        peer, name = _peer_of(request)
        refusal = self.slots.take(peer)
        if refusal is not None:
            self._note_load(refusal=refusal, peer=name)
            headers = {"Retry-After": str(RETRY_AFTER_S)}
            if refusal == "busy":
                busy = f"{self.slots.max_uploads} uploads in progress, try another peer"
                err = ErrorAnswer(503, "UNAVAILABLE", busy, headers)
            else:
                many = f"at most {self.slots.per_peer} downloads at once per peer"
                err = ErrorAnswer(429, "TOOMANYREQUESTS", many, headers)
            return await error(request, err, timeout_s=self._timeout_s)
        try:
            return await self._content.serve(request, "blobs", target.digest)
        finally:
            self.slots.give_back(peer)
            self._note_load()

    def _note_load(self, *, refusal: str | None = None, peer: str = "") -> None:
        """Log the transitions (saturated, then not), and each refusal at debug level."""
        if refusal is not None:
            log.debug("peer_request_refused", reason=refusal, peer=peer)
            if not self._is_saturated:
                self._is_saturated = True
                log.info(
                    "peer_uploads_saturated",
                    reason=refusal,
                    peer=peer,
                    active=self.slots.active,
                    max_uploads=self.slots.max_uploads,
                )
        elif self._is_saturated and self.slots.active < self.slots.max_uploads:
            self._is_saturated = False
            log.info("peer_uploads_available", active=self.slots.active)

    async def _own(
        self, request: BaseRequest, target: PeerTarget, offer: StoreOffer
    ) -> StreamResponse:
        if target.kind == "holdings":
            holdings = Holdings(
                node=self.node,
                uploads_active=self.slots.active,
                uploads_max=self.slots.max_uploads,
                bundles=tuple(
                    holding_of(b.bundle_id, b.manifest_digest, b.sizes, offer.stored)
                    for _, b in sorted(offer.bundles.items())
                ),
            )
            body = render_holdings(holdings)
            return await answer(request, 200, _JSON, body, timeout_s=self._timeout_s)
        bundle = offer.bundles.get(target.bundle_id)
        if bundle is None:
            # A peer may ask as soon as this node's holdings are published, before the
            # offer's TTL has passed: when the store has the bundle's signed manifest now,
            # read the offer again (a stat per miss; the id was checked by the route).
            manifest = self.store_root / layout.bundle_dir(target.bundle_id) / MANIFEST_NAME
            if await in_thread(manifest.is_file):
                offer = await self._current_offer(max_age_s=0.0)
                bundle = offer.bundles.get(target.bundle_id)
        if bundle is None:
            err = ErrorAnswer(404, "BUNDLE_UNKNOWN", f"no bundle {target.bundle_id}")
            return await error(request, err, timeout_s=self._timeout_s)
        if target.kind == "have":
            have = have_of(bundle.manifest_digest, bundle.sizes, offer.stored, offer.fetching)
            body = render_have(have)
            return await answer(request, 200, _JSON, body, timeout_s=self._timeout_s)
        if target.kind == "release-signature":
            return await self._release_signature(request, target)
        data = await in_thread(read_bundle_file, self.store_root, target.bundle_id, target.file)
        if data is None:
            err = ErrorAnswer(404, "BUNDLE_UNKNOWN", f"no {target.file} for {target.bundle_id}")
            return await error(request, err, timeout_s=self._timeout_s)
        kind = _JSON if target.file == MANIFEST_NAME else {"Content-Type": "text/plain"}
        return await answer(request, 200, kind, data, timeout_s=self._timeout_s)

    async def _release_signature(self, request: BaseRequest, target: PeerTarget) -> StreamResponse:
        """A release signature file the bundle's stored manifest lists, checked as it is read."""
        bundle_id, path = target.bundle_id, target.file
        data = await in_thread(self.release_files.read, bundle_id, path)
        if data is None:
            err = ErrorAnswer(404, "BUNDLE_UNKNOWN", f"no {path} listed for {bundle_id}")
            return await error(request, err, timeout_s=self._timeout_s)
        return await answer(request, 200, _OCTETS, data, timeout_s=self._timeout_s)

"""The node mirror: the store served read-only on loopback, always (docs/mirror.md).

Runs in its own unprivileged process (``nodeagent serve-mirror``, started by
``nodeagent-mirror.socket`` on the first connection, decision 0063), on ``[mirror] listen``
(plain HTTP, a loopback address only; the socket systemd holds, or one it binds itself when
run by hand), on the one ``Listener`` (bounded heads, deadlines, connection caps at
accept). Once started it serves until stopped and answers 404 while the store is empty
(decision 0057: one state, no start on first content to get wrong).

What it serves (``nodeagent.adapters.store.mirror_offer``), re-read when older than
``OFFER_TTL_S``:

* bundle content (the blobs and signature tags peers are offered: stored, listed by a
  verified signed manifest) to any local client;
* registry-set blobs (pulled with the pull secret) only to a client presenting the
  mirror's credential (``nodeagent.mirror.credentials``; the verifiers are re-read when
  older than ``OFFER_TTL_S``); to any other it is 404, as a digest not held;
* under the repository names the store holds only, by digest, plus the signature tags a
  verified signed manifest lists (``nodeagent.mirror.routes``); everything else is 404.

Every byte is checked as it is sent (``nodeagent.adapters.http.content``). ``GET /v2/``
without a valid credential is answered 401 with a ``Basic`` challenge: containers-image
sends its ``auth.json`` entry only to a registry whose ping asked for one, and a client
without one still gets bundle content after it. A digest asked for that the store lacks is
counted and logged at most once a minute per digest (``node_mirror_digest_missing``). An
image manifest is answered only when every blob it names can be served to the client
(``nodeagent.mirror.complete``, decision 0061), else 404 and its first absent blob counts
as missing.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from nodeagent.adapters.http.admission import Caps, Door
from nodeagent.adapters.http.content import ServedContent, answer, error
from nodeagent.adapters.http.listener import Listener
from nodeagent.adapters.http.streamer import in_thread
from nodeagent.adapters.store.mirror_offer import MirrorOffer, read_mirror_offer
from nodeagent.adapters.store.offer import StoreOffer
from nodeagent.bundles.manifest import BundleError, ExpectedFile
from nodeagent.bundles.mirror import ErrorAnswer, Fetch, ServedCounters
from nodeagent.config.mirror import MirrorSettings
from nodeagent.errors import HostFileError
from nodeagent.mirror.complete import Parts, manifest_parts
from nodeagent.mirror.credentials import MAX_VERIFIER_FILE_BYTES, is_allowed, parse_verifiers
from nodeagent.mirror.misses import Misses
from nodeagent.mirror.routes import NAME_UNKNOWN, UnknownName, route_node
from nodeagent.mirror.state import MirrorReport
from nodeagent.registries import node_platform
from nodeagent.registries.manifests import Platform

log = structlog.get_logger(__name__)

OFFER_TTL_S: Final = 1.0
"""How long the store's offer and the credential verifiers are used before being read again."""
CHUNK_BYTES: Final = 2 << 20
MAX_PARTS: Final = 4096
"""Image manifests whose blob lists are kept (a few hundred bytes each)."""
"""Hash/send step (as the peer server's: a few uploads at once hold a few MiB each)."""
CHALLENGE: Final = {"WWW-Authenticate": 'Basic realm="nodeagent node mirror"'}
_CHALLENGED: Final = ErrorAnswer(401, "UNAUTHORIZED", "registry sets need a credential", CHALLENGE)
_JSON: Final = {"Content-Type": "application/json"}
_UNSIGNED: Final = ErrorAnswer(404, "MANIFEST_UNKNOWN", "no signed manifest lists that tag")
MAX_HELD: Final = 32
"""Manifest requests held at once while the daemon fetches what they ask for (``[mirror]
miss_wait_s``); more are answered 404 at once (CRI-O pulls ``[pull] concurrency`` images at
once, at most 64, each asking one manifest at a time)."""


@dataclass(frozen=True, slots=True)
class MirrorCounters:
    """What the node mirror has done since it started."""

    served: ServedCounters
    missing: int
    """Manifests and blobs asked for that the store does not hold."""
    denied: int
    """Registry-set content asked for without the mirror's credential."""
    recent_missing: tuple[str, ...]
    """The digests missed most recently, newest first."""


def mirror_caps(settings: MirrorSettings) -> Caps:
    """One cap for all: every client is local."""
    return Caps(settings.max_connections, settings.max_connections)


def _read_bounded(path: Path) -> bytes:
    try:
        with path.open("rb") as stream:
            return stream.read(MAX_VERIFIER_FILE_BYTES)
    except OSError:
        return b""


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file is written again (atomically: a new inode), or None."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


class NodeMirror:
    """Serves the store at ``store_root`` on ``host:port`` until closed; ``verifiers_file``:
    the credential verifiers the root daemon writes (absent: registry sets never served)."""

    def __init__(
        self,
        store_root: Path,
        *,
        host: str,
        port: int,
        verifiers_file: Path | None,
        caps: Caps,
        request_timeout_s: float,
        chunk_bytes: int = CHUNK_BYTES,
        offer_ttl_s: float = OFFER_TTL_S,
        on_missing: Callable[[str], None] | None = None,
        platform: Platform | None = None,
        sock: socket.socket | None = None,
        miss_wait_s: float = 0.0,
    ) -> None:
        self.store_root, self._host, self._port = store_root, host, port
        self._sock = sock
        """The listening socket systemd passed (``nodeagent-mirror.socket``), else None:
        the mirror binds ``host:port`` itself (decision 0063)."""
        self._verifiers_file, self._timeout_s = verifiers_file, request_timeout_s
        self._ttl_s, self._on_missing = offer_ttl_s, on_missing
        self._miss_wait_s = miss_wait_s
        self._held = 0
        """Manifest requests held now, waiting for the daemon's fetch (``MAX_HELD`` at most)."""
        self._content = ServedContent(
            store_root,
            self._lookup,
            chunk_bytes=chunk_bytes,
            io_timeout_s=request_timeout_s,
            on_rejected=self._reject,
        )
        self._listener = Listener(
            self._answer, io_timeout_s=request_timeout_s, caps=caps, name="node-mirror"
        )
        self._offer = MirrorOffer(StoreOffer({}, {}, frozenset()))
        self._verifiers: frozenset[str] = frozenset()
        self._read_at: float | None = None
        self._verifiers_stamp: tuple[int, int, int] | None = None
        self._lock = asyncio.Lock()
        self._misses = Misses()
        self._denied = 0
        self._parts: OrderedDict[str, Parts] = OrderedDict()
        """Manifest digest → what it needs (content-addressed: never stale; bounded)."""
        self._platform = platform or node_platform(os.uname().machine)
        self._started = False
        self._is_open = self._said_missing = False

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def door(self) -> Door:
        return self._listener.door

    @property
    def counters(self) -> MirrorCounters:
        return MirrorCounters(
            self._content.counters, self._misses.total, self._denied, self._misses.recent()
        )

    def report(self, *, serving: bool) -> MirrorReport:
        """The state reported to the daemon (``nodeagent.site.reports``)."""
        served = self._content.counters
        return MirrorReport(
            serving,
            len(self._offer.peers.blobs),
            len(self._offer.private),
            served.requests,
            served.bytes_served,
            self._misses.total,
            self._denied,
        )

    @property
    def offer(self) -> MirrorOffer:
        """The offer last read."""
        return self._offer

    async def start(self) -> None:
        self._open_store()
        await self._listener.start(self._host, self._port, sock=self._sock)
        self._started = True
        offer = await self._current()
        log.info(
            "node_mirror_started",
            address=f"{self._host}:{self.port}",
            blobs=len(offer.peers.blobs),
            registry_blobs=len(offer.private),
            max_connections=self.door.caps.max_connections,
        )

    async def close(self, *, grace_s: float = 10.0) -> None:
        if self._started:
            await self._listener.close(grace_s=grace_s)
            self._started = False
            log.info("node_mirror_stopped", bytes=self._content.counters.bytes_served)
        self._content.close()
        self._is_open = False

    async def __aenter__(self) -> NodeMirror:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def settled(self) -> None:
        await self._listener.settled()

    # -------------------------------------------------------------- the store
    def _open_store(self) -> bool:
        """Open the store's directory; a store not made yet (the daemon makes it) is empty,
        not an error: every answer is 404 until it exists."""
        if self._is_open:
            return True
        try:
            self._content.open()
        except HostFileError as err:
            if not self._said_missing:
                self._said_missing = True
                log.info("node_mirror_store_absent", store=str(self.store_root), error=err.message)
            return False
        self._is_open = True
        return True

    def _lookup(self, digest: str) -> ExpectedFile | None:
        return self._offer.lookup(digest)

    def _read(self) -> tuple[MirrorOffer, frozenset[str]]:
        if not self._open_store():
            offer = MirrorOffer(StoreOffer({}, {}, frozenset()))
        else:
            offer = read_mirror_offer(self.store_root, self._offer)
        return offer, self._read_verifiers()

    def _read_verifiers(self) -> frozenset[str]:
        path = self._verifiers_file
        if path is None:
            return frozenset()
        self._verifiers_stamp = _stamp(path)
        return parse_verifiers(_read_bounded(path))

    def _reread_verifiers(self) -> frozenset[str] | None:
        """The verifiers again if the file changed since they were read, else None."""
        path = self._verifiers_file
        if path is None or _stamp(path) == self._verifiers_stamp:
            return None
        return self._read_verifiers()

    async def _current(self) -> MirrorOffer:
        loop = asyncio.get_running_loop()
        async with self._lock:
            if self._read_at is None or loop.time() - self._read_at >= self._ttl_s:
                offer, self._verifiers = await in_thread(self._read)
                if offer != self._offer:
                    self._content.forget_verdicts(frozenset(offer.peers.blobs) | set(offer.private))
                self._offer, self._read_at = offer, loop.time()
        return self._offer

    async def _is_trusted(self, authorization: str | None) -> bool:
        """Whether ``authorization`` presents the mirror's credential. One the verifiers do
        not match has the file looked at first (a ``stat``): the daemon may have written it
        since they were read (at its start, or a new credential), and it is read again then,
        rather than refusing a good credential until the offer's next read."""
        if is_allowed(authorization, self._verifiers):
            return True
        if authorization is None or self._verifiers_file is None:
            return False
        async with self._lock:
            again = await in_thread(self._reread_verifiers)
            if again is not None:
                self._verifiers = again
        return is_allowed(authorization, self._verifiers)

    def _reject(self, digest: str, err: BundleError) -> None:
        # The daemon's store verify finds it too; the peer server reports it (decision 0056).
        log.error("node_mirror_blob_rejected", digest=digest, reason=err.reason, error=str(err))

    # -------------------------------------------------------------- requests
    async def _answer(self, request: BaseRequest) -> StreamResponse:
        self._content.count(requests=1)
        offer = await self._current()
        path = request.raw_path.partition("?")[0]
        target = route_node(request.method, path, offer.repositories)
        is_trusted = await self._is_trusted(request.headers.get("Authorization"))
        if isinstance(target, UnknownName) and target.target.kind == "manifests":
            # a repository the store does not hold yet: the fetch may bring it (0061)
            offer = await self._hold(target.target.digest, is_trusted=is_trusted)
            target = route_node(request.method, path, offer.repositories)
        if isinstance(target, UnknownName):
            if target.target.kind in ("manifests", "blobs"):
                self._missed(target.target)
            return await error(request, NAME_UNKNOWN, timeout_s=self._timeout_s)
        if isinstance(target, ErrorAnswer):
            return await error(request, target, timeout_s=self._timeout_s)
        if target.kind == "base":
            return await self._base(request, is_trusted=is_trusted)
        if target.name:  # a tag (a signature's, or one a bundle serves): only when listed
            listed = offer.peers.tags.get(target.name)
            if listed is None:
                return await error(request, _UNSIGNED, timeout_s=self._timeout_s)
            return await self._content.serve(request, "manifests", listed)
        return await self._by_digest(request, target, offer, is_trusted=is_trusted)

    async def _base(self, request: BaseRequest, *, is_trusted: bool) -> StreamResponse:
        """``/v2/``: 200 with the credential, else a ``Basic`` challenge (so that clients
        send their ``auth.json`` entry with the next requests; bundle content needs none)."""
        if is_trusted:
            return await answer(request, 200, _JSON, b"{}", timeout_s=self._timeout_s)
        return await error(request, _CHALLENGED, timeout_s=self._timeout_s)

    async def _is_whole(self, digest: str, offer: MirrorOffer, is_trusted: bool) -> bool:
        """Whether the image ``digest`` can be served now, every blob it names included."""
        if digest in offer.peers.blobs or (is_trusted and digest in offer.private):
            return not await self._absent(digest, offer, is_trusted=is_trusted)
        return False

    async def _hold(self, digest: str, *, is_trusted: bool) -> MirrorOffer:
        """Hold a manifest request the store cannot serve yet (decision 0061): the miss is
        reported at once (the daemon's fetcher looks), the store's offer read again each
        ``offer_ttl_s``, for at most ``miss_wait_s``; the offer then, whole or not. Bounded:
        ``MAX_HELD`` at once, a registry-set digest without the credential never held (it
        would never be served to this client)."""
        offer = self._offer
        if self._miss_wait_s <= 0 or self._held >= MAX_HELD or digest in offer.private:
            return offer
        self._missed(Fetch("manifests", digest=digest))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._miss_wait_s
        self._held += 1
        try:
            while loop.time() < deadline:
                await asyncio.sleep(min(self._ttl_s, max(0.0, deadline - loop.time())))
                offer = await self._current()
                if await self._is_whole(digest, offer, is_trusted):
                    waited_s = self._miss_wait_s - (deadline - loop.time())
                    log.info("node_mirror_miss_served", digest=digest, seconds=round(waited_s, 1))
                    return offer
        finally:
            self._held -= 1
        return offer

    def _missed(self, target: Fetch) -> None:
        """A digest asked for that the store lacks: counted; logged and reported to the
        daemon at most once a minute per digest."""
        missed = self._misses.note(target.digest, asyncio.get_running_loop().time())
        if missed is None:
            return
        log.info("node_mirror_digest_missing", digest=target.digest, kind=target.kind, asked=missed)
        if self._on_missing is not None:
            self._on_missing(target.digest)

    async def _parts_of(self, digest: str) -> Parts:
        parts = self._parts.get(digest)
        if parts is None:
            loaded = await self._content.load_manifest(digest)
            parts = Parts() if loaded is None else manifest_parts(*loaded, self._platform)
            self._parts[digest] = parts
            while len(self._parts) > MAX_PARTS:
                self._parts.popitem(last=False)
        return parts

    async def _absent(
        self, digest: str, offer: MirrorOffer, *, is_trusted: bool
    ) -> tuple[str, ...]:
        """What of the image ``digest`` names this client cannot be served (decision 0061:
        containers-image takes every blob from the source that gave the manifest)."""

        def held(found: str) -> bool:
            return found in offer.peers.blobs or (is_trusted and found in offer.private)

        parts = await self._parts_of(digest)
        if parts.child:  # an index: its entry for this node's platform, whole
            if not held(parts.child):
                return (parts.child,)
            parts = await self._parts_of(parts.child)
        return tuple(d for d in parts.blobs if not held(d))

    async def _by_digest(
        self, request: BaseRequest, target: Fetch, offer: MirrorOffer, *, is_trusted: bool
    ) -> StreamResponse:
        digest = target.digest
        if target.kind == "manifests" and not await self._is_whole(digest, offer, is_trusted):
            offer = await self._hold(digest, is_trusted=is_trusted)
        if digest in offer.peers.blobs or (is_trusted and digest in offer.private):
            absent = await self._absent(digest, offer, is_trusted=is_trusted)
            if not absent:
                return await self._content.serve(request, target.kind, digest)
            self._missed(Fetch("blobs", digest=absent[0]))  # the fetcher looks (0061)
            incomplete = ErrorAnswer(404, "MANIFEST_UNKNOWN", f"{digest}: not all its blobs held")
            return await error(request, incomplete, timeout_s=self._timeout_s)
        if digest in offer.private:
            self._denied += 1
            log.debug("node_mirror_credential_missing", digest=digest)
        else:
            self._missed(target)
        code = "MANIFEST_UNKNOWN" if target.kind == "manifests" else "BLOB_UNKNOWN"
        unknown = ErrorAnswer(404, code, f"{digest} is not held by this node")
        return await error(request, unknown, timeout_s=self._timeout_s)

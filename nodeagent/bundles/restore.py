"""Pinned images back from the node's image store, with no network and no stick.

After a power cut CRI-O may have wiped or repaired away images nodeagent had pinned;
the sync finds them missing (``sync.losses``) and asks ``StoreRestorer`` first: the
store is served on loopback exactly as a bundle is at its import (``serving``), every
blob hashed as it is sent, and the runtime pulls each image by its own name through a
mirror of its repository. What the store lacks (or a blob that fails its digest) is left
to the image's registry. Restores take no part in node readiness gates or pacing meant
for registry pulls: after a power cut the node may be NotReady because its images are
gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import structlog

from nodeagent.bundles.import_ports import SignedServerFactory
from nodeagent.bundles.manifest import ExpectedFile
from nodeagent.bundles.serving import (
    MIRROR_LOCK,
    BundleServerPort,
    MirrorPullPorts,
    SigstorePort,
    pull_via_mirror,
    reading_signatures,
)
from nodeagent.bundles.tags import ServedTag
from nodeagent.errors import BundleServerFailed
from nodeagent.prepull import PullResult
from nodeagent.references import parse_pinned_image_ref

log = structlog.get_logger(__name__)


class Restorable(Protocol):
    @property
    def refs(self) -> tuple[str, ...]: ...

    @property
    def files(self) -> dict[str, ExpectedFile]: ...

    @property
    def tags(self) -> dict[str, str]: ...

    @property
    def served(self) -> tuple[ServedTag, ...]: ...


class StoreSource(Protocol):
    """The store as the restorer reads it (``adapters.store.node_store.NodeImageStore``);
    ``restorable`` is blocking."""

    @property
    def root(self) -> Path: ...

    def restorable(self, refs: Sequence[str]) -> Restorable: ...


class StoreRestorer:
    """``sync.losses.ImageRestorer`` over the node's image store."""

    def __init__(
        self,
        source: StoreSource,
        make_server: Callable[[Path, Mapping[str, ExpectedFile]], BundleServerPort],
        session: MirrorPullPorts,
        *,
        make_signed_server: SignedServerFactory | None = None,
        sigstore: SigstorePort | None = None,
    ) -> None:
        """``make_signed_server`` and ``sigstore``: images of bundles with image signatures
        are served with their signature tags, the runtime told to read them (as at import)."""
        self.source = source
        self.make_server = make_server
        self.session = session
        self.make_signed_server = make_signed_server
        self.sigstore = sigstore if make_signed_server is not None else None

    async def holds(self, refs: Sequence[str]) -> list[str]:
        found = await asyncio.to_thread(self.source.restorable, refs)
        return list(found.refs)

    async def restore(self, refs: Sequence[str]) -> Mapping[str, PullResult]:
        found = await asyncio.to_thread(self.source.restorable, refs)
        wanted = [ref for ref in refs if ref in set(found.refs)]
        if not wanted:
            return {}
        async with MIRROR_LOCK:
            make_signed, sigstore = self.make_signed_server, self.sigstore if found.tags else None
            if make_signed is not None and sigstore is not None:
                server = make_signed(self.source.root, found.files, found.tags)
            else:
                server = self.make_server(self.source.root, found.files)
            try:
                await server.start()
            except BundleServerFailed as exc:  # the registries are asked instead
                log.warning("store_restore_skipped", reason=exc.reason, error=exc.message)
                return {}
            images = [parse_pinned_image_ref(ref) for ref in wanted]
            async with reading_signatures(sigstore, server.mirror_host):
                served = [t for t in found.served if str(t.image) in wanted]
                results = await pull_via_mirror(
                    self.session, server, images, wanted, source="store", tags=served
                )
            for rejected in server.rejections:
                log.warning("store_blob_refused", reason=rejected.reason, error=rejected.message)
        return results

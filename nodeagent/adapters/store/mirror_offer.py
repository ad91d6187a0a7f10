"""What the node mirror serves: the peers' offer (bundle content, signature tags) plus the
registry sets' stored blobs, which only a client with the mirror's credential gets.

Read without the store lock, as the peer server's offer (``offer.read_offer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.offer import StoreOffer, read_offer
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.adapters.store.source import store_files
from nodeagent.bundles.manifest import ExpectedFile
from nodeagent.bundles.mirror import mirror_repositories
from nodeagent.errors import ImageReferenceInvalid
from nodeagent.references import parse_pinned_image_ref
from nodeagent.store.layout import BundleRecord


@dataclass(frozen=True, slots=True)
class MirrorOffer:
    peers: StoreOffer
    """Bundle content: the blobs and signature tags peers are offered too (any local client)."""
    private: Mapping[str, ExpectedFile] = field(default_factory=dict)
    """Registry-set blobs no bundle offers: served only with the mirror's credential."""
    repositories: frozenset[str] = frozenset()
    """Repository names served under: each stored image's repository path (the drop-in's
    mirror location replaces ``host`` by the mirror's address)."""

    @property
    def is_empty(self) -> bool:
        return not self.peers.blobs and not self.private

    def lookup(self, digest: str) -> ExpectedFile | None:
        return self.peers.blobs.get(digest) or self.private.get(digest)


def _names(records: list[BundleRecord]) -> frozenset[str]:
    refs = []
    for record in records:
        for image in record.images:
            try:
                refs.append(parse_pinned_image_ref(image.name))
            except ImageReferenceInvalid:
                continue
    return frozenset(repository.partition("/")[2] for repository in mirror_repositories(refs))


def read_mirror_offer(root: Path, previous: MirrorOffer | None = None) -> MirrorOffer:
    """The store as the node mirror serves it now (blocking: run in a thread)."""
    peers = read_offer(root, None if previous is None else previous.peers)
    records = StoreRecords(root).load(is_repairing=False).records
    stored = BlobStore(root).stored()
    sets = [r for r in records if r.is_registry]
    sizes = {
        blob.digest: blob.size_bytes
        for record in sets
        for blob in record.blobs
        if stored.get(blob.digest) == blob.size_bytes and blob.digest not in peers.blobs
    }
    held = [r for r in records if r.is_registry or r.bundle_id in peers.bundles]
    return MirrorOffer(peers, store_files(sizes), _names(held))

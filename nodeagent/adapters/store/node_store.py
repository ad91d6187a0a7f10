"""The node's image store as the bundle importer and the restorer use it.

One object over the store directory: how much of a bundle it lacks, the copy from a
medium (``copier.copy_bundle``), the files the loopback server serves from it, and which
pinned images it can bring back without any network (every blob of a bundle that
carried the image is stored). Blocking calls: the services run them in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import CopyResult, StoreLimits, copy_bundle, plan_copy
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.adapters.store.source import served_from_store, store_files, stored_signature_tags
from nodeagent.bundles.manifest import BundleManifest, ExpectedFile
from nodeagent.progress import ByteProgress


@dataclass(frozen=True, slots=True)
class Restorable:
    """Images the store can bring back, and every blob the server may serve for them."""

    refs: tuple[str, ...]
    files: dict[str, ExpectedFile]
    tags: dict[str, str] = field(default_factory=dict)
    """Signature tags of those images' stored bundles (``signatures.served_tags``)."""


class NodeImageStore:
    """``bundles.importer.ImageStorePort`` and ``bundles.restore.StoreSource`` over a directory."""

    def __init__(self, root: Path, trusted_keys_dir: Path, limits: StoreLimits) -> None:
        self.root = root
        self.trusted_keys_dir = trusted_keys_dir
        self.limits = limits

    def missing_bytes(self, manifest: BundleManifest) -> int:
        """Bytes of the bundle's blobs the store does not hold yet."""
        return plan_copy(BlobStore(self.root), manifest).missing_bytes

    def shares_filesystem(self, path: str) -> bool:
        """Whether the store lives on the filesystem of ``path`` (the runtime's images)."""
        return _device(self.root) == _device(Path(path))

    def copy(
        self,
        medium_root: Path,
        manifest: BundleManifest,
        on_progress: Callable[[ByteProgress], None],
    ) -> CopyResult:
        return copy_bundle(
            self.root,
            medium_root,
            manifest,
            self.trusted_keys_dir,
            limits=self.limits,
            on_progress=on_progress,
        )

    def served_files(self, manifest: BundleManifest) -> dict[str, ExpectedFile]:
        return served_from_store(manifest)

    def restorable(self, refs: Sequence[str]) -> Restorable:
        """Those of ``refs`` a stored bundle carried and whose blobs are all stored."""
        if not (self.root / "bundles").is_dir():
            return Restorable((), {})
        wanted = set(refs)
        store = BlobStore(self.root)
        stored = store.stored()
        found: list[str] = []
        sizes: dict[str, int] = {}
        tags: dict[str, str] = {}
        for record in StoreRecords(self.root).load(is_repairing=False).records:
            names = {image.name for image in record.images} & wanted
            if not names:
                continue
            if any(stored.get(blob.digest) != blob.size_bytes for blob in record.blobs):
                continue  # incomplete (a corrupt blob removed): the registry, if any
            found.extend(sorted(names - set(found)))
            sizes.update({blob.digest: blob.size_bytes for blob in record.blobs})
            tags.update(stored_signature_tags(self.root, record.bundle_id))
        return Restorable(tuple(found), store_files(sizes), tags)


def _device(path: Path) -> int:
    """The device of ``path`` or of its nearest existing ancestor."""
    current = path.absolute()
    while True:
        try:
            return current.stat().st_dev
        except FileNotFoundError:
            if current.parent == current:
                raise
            current = current.parent

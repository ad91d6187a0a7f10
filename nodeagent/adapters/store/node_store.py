"""The node's image store as the bundle importer and the restorer use it.

One object over the store directory: how much of a bundle it lacks, the copy from a
medium (``copier.copy_bundle``), the files the loopback server serves from it, and which
pinned images it can bring back without any network (every blob of a bundle that
carried the image is stored). Blocking calls: the services run them in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from nodeagent.adapters.fips import FIPS_ENABLED_FILE
from nodeagent.adapters.store import keeper
from nodeagent.adapters.store.blobs import BlobStore, VerifiedBlob
from nodeagent.adapters.store.copier import CopyResult, StoreLimits, copy_bundle, plan_copy
from nodeagent.adapters.store.records import StoreRecords, read_bundle_file
from nodeagent.adapters.store.source import (
    served_from_store,
    store_files,
    stored_served_tags,
    stored_signature_tags,
)
from nodeagent.bundles.manifest import BundleError, BundleManifest, ExpectedFile, parse_manifest
from nodeagent.bundles.signatures import (
    MAX_SIGNATURE_MANIFEST_BYTES,
    ImageSignature,
    signature_manifest_blobs,
)
from nodeagent.bundles.tags import ServedTag
from nodeagent.errors import NodeAgentError
from nodeagent.progress import ByteProgress
from nodeagent.registries import MAX_MANIFEST_BYTES
from nodeagent.store import layout

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Restorable:
    """Images the store can bring back, and every blob the server may serve for them."""

    refs: tuple[str, ...]
    files: dict[str, ExpectedFile]
    tags: dict[str, str] = field(default_factory=dict)
    """Tags of those images' stored bundles (``tags.answered_tags``: signature tags and
    served tags), ``<repository>/<tag>`` → digest."""
    served: tuple[ServedTag, ...] = ()
    """The served tags (``servedTags``) of those images: pulled again once they are back."""


@dataclass(frozen=True, slots=True)
class CarriedSignatures:
    """The sigstore signatures stored bundles carried for some images."""

    signatures: tuple[ImageSignature, ...]
    """Each listed in the ``imageSignatures`` of a stored (verified) bundle's manifest."""
    held: frozenset[str]
    """Those images whose signature manifest and every blob it names are stored."""


class NodeImageStore:
    """``bundles.importer.ImageStorePort`` and ``bundles.restore.StoreSource`` over a directory."""

    def __init__(
        self,
        root: Path,
        trusted_keys_dir: Path,
        limits: StoreLimits,
        *,
        fips_switch: Path = FIPS_ENABLED_FILE,
    ) -> None:
        self.root = root
        self.trusted_keys_dir = trusted_keys_dir
        self.fips_switch = fips_switch
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
        should_stop: Callable[[], bool] = lambda: False,
        *,
        on_admitted: Callable[[], None] = lambda: None,
        on_stored: Callable[[str], None] = lambda _digest: None,
    ) -> CopyResult:
        return copy_bundle(
            self.root,
            medium_root,
            manifest,
            self.trusted_keys_dir,
            limits=self.limits,
            on_progress=on_progress,
            fips_switch=self.fips_switch,
            should_stop=should_stop,
            on_admitted=on_admitted,
            on_stored=on_stored,
        )

    def has_blob(self, digest: str) -> bool:
        """Whether the blob is stored (a partial is not)."""
        return BlobStore(self.root).size_of(digest) is not None

    def read_manifest(self, digest: str) -> bytes | None:
        """A stored blob small enough to be a manifest (``MAX_MANIFEST_BYTES``), else None;
        it was verified when stored."""
        store = BlobStore(self.root)
        size = store.size_of(digest)
        if size is None or size > MAX_MANIFEST_BYTES:
            return None
        body = memoryview(bytearray(size))
        done = 0
        with store.open_verified(digest) as blob:
            while count := blob.readinto(body[done:]):  # the last call checks the digest
                done += count
        return bytes(body[:done])

    def discard(self, digests: Iterable[str]) -> tuple[int, int]:
        """Remove those of ``digests`` nothing stored lists (``keeper.discard``)."""
        return keeper.discard(self.root, digests)

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
        served: list[ServedTag] = []
        for record in StoreRecords(self.root).load(is_repairing=False).records:
            names = {image.name for image in record.images} & wanted
            if not names:
                continue
            if any(stored.get(blob.digest) != blob.size_bytes for blob in record.blobs):
                continue  # incomplete (a corrupt blob removed): the registry, if any
            found.extend(sorted(names - set(found)))
            sizes.update({blob.digest: blob.size_bytes for blob in record.blobs})
            tags.update(stored_signature_tags(self.root, record.bundle_id))
            served += [t for t in stored_served_tags(self.root, record.bundle_id)
                       if str(t.image) in names]  # fmt: skip
        return Restorable(tuple(found), store_files(sizes), tags, tuple(served))

    def carried_signatures(self, refs: Sequence[str]) -> CarriedSignatures:
        """The signatures stored bundles list for those of ``refs`` they carried, and which
        of them the store could serve now (manifest and blobs stored, sizes as listed)."""
        wanted = set(refs)
        blobs = BlobStore(self.root)
        stored = blobs.stored()
        found: dict[str, ImageSignature] = {}
        held: set[str] = set()
        for record in StoreRecords(self.root).load(is_repairing=False).records:
            if record.is_registry:
                continue
            for signature in _listed_signatures(self.root, record.bundle_id):
                name = str(signature.image)
                if name not in wanted:
                    continue
                found.setdefault(name, signature)
                if _is_stored(blobs, stored, signature.manifest_digest):
                    held.add(name)
        return CarriedSignatures(tuple(found.values()), frozenset(held))


def _listed_signatures(root: Path, bundle_id: str) -> tuple[ImageSignature, ...]:
    """A stored bundle's ``imageSignatures`` (its manifest was verified when stored)."""
    data = read_bundle_file(root, bundle_id, layout.MANIFEST_NAME)
    try:
        return () if data is None else parse_manifest(data).image_signatures
    except BundleError:
        return ()


def _is_stored(blobs: BlobStore, stored: Mapping[str, int], manifest_digest: str) -> bool:
    """Whether a signature manifest and every blob it names are stored with their sizes."""
    size = stored.get(manifest_digest)
    if size is None or size > MAX_SIGNATURE_MANIFEST_BYTES:
        return False
    try:
        with blobs.open_verified(manifest_digest) as blob:
            data = _read_all(blob, size)
    except NodeAgentError as err:  # damaged or gone: the verifier reports and removes it
        log.warning("signature_manifest_unreadable", digest=manifest_digest,
                    reason=err.reason, error=err.message)  # fmt: skip
        return False
    except OSError as err:  # the disk failed to read: said, never taken for "not stored"
        log.error("signature_manifest_unreadable", digest=manifest_digest,
                  reason="StoreReadFailed", error=err.strerror or type(err).__name__)  # fmt: skip
        return False
    children = signature_manifest_blobs(data)
    if children is None:
        return False
    return all(stored.get(digest) == length for digest, length in children.items())


def _read_all(blob: VerifiedBlob, size: int) -> bytes:
    """The blob's bytes, read to its end (where its digest is checked)."""
    buffer = bytearray(size + 1)
    view = memoryview(buffer)
    read = 0
    while read <= size and (count := blob.readinto(view[read:])):
        read += count
    return bytes(buffer[:read]) if read <= size else b""  # grew: not verified, not used


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

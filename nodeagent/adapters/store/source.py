"""The store as a blob source: for the loopback bundle server, and for any reader.

The store's blob paths are the OCI layout's (``blobs/sha256/<hex>``), so the loopback
server the importer uses for a medium (``adapters.http.mirror.BundleServer``) serves
from the store unchanged: ``BundleServer(store_root, served_from_store(manifest))``. It
opens each path beneath the root without following links, checks the size, and hashes
each blob as it sends it, holding the last chunk back until the digest matched
(``adapters.http.streamer``): a blob damaged in the store never reaches the runtime
whole. ``open_blob`` is the same promise for a reader in the process.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from nodeagent.adapters.store.blobs import BlobStore, VerifiedBlob
from nodeagent.adapters.store.records import read_bundle_file
from nodeagent.bundles.manifest import BundleError, BundleManifest, ExpectedFile, parse_manifest
from nodeagent.bundles.tags import ServedTag, answered_tags, tags_doc
from nodeagent.store import layout


def served_from_store(manifest: BundleManifest) -> dict[str, ExpectedFile]:
    """Digest → the blob's file in the store, for every blob the verified manifest lists."""
    return store_files({digest: file.size_bytes for digest, file in manifest.blobs.items()})


def store_files(sizes: Mapping[str, int]) -> dict[str, ExpectedFile]:
    """Digest → ``ExpectedFile`` at ``blobs/sha256/<hex>`` with its size and digest."""
    return {
        digest: ExpectedFile(layout.blob_path(digest), size, digest.removeprefix("sha256:"))
        for digest, size in sizes.items()
    }


def open_blob(store_root: Path, digest: str) -> VerifiedBlob:
    """A stored blob, verified while it is read (``StoreBlobCorrupt`` at its end if damaged,
    ``StoreBlobMissing`` when absent)."""
    return BlobStore(store_root).open_verified(digest)


def _stored_manifest(store_root: Path, bundle_id: str) -> BundleManifest | None:
    """A stored bundle's signed manifest (verified when it was stored); None when it is
    gone or unreadable."""
    data = read_bundle_file(store_root, bundle_id, layout.MANIFEST_NAME)
    try:
        return None if data is None else parse_manifest(data)
    except BundleError:
        return None


def stored_signature_tags(store_root: Path, bundle_id: str) -> dict[str, str]:
    """The tags a stored bundle's signed manifest lists, verified when it was stored: its
    signature tags (``signatures.served_tags``) and its served tags (``servedTags``,
    ``tags.tag_names``); none when it is gone or unreadable."""
    manifest = _stored_manifest(store_root, bundle_id)
    if manifest is None:
        return {}
    return answered_tags(manifest.image_signatures, manifest.served_tags)


def stored_served_tags(store_root: Path, bundle_id: str) -> tuple[ServedTag, ...]:
    """The tags a stored bundle's signed manifest serves (``servedTags``)."""
    manifest = _stored_manifest(store_root, bundle_id)
    return () if manifest is None else manifest.served_tags


def stored_frozen_tags(store_root: Path, bundle_id: str) -> dict[str, str]:
    """``host/repository:tag`` → digest: the tags a stored bundle serves (``servedTags``),
    frozen at that digest while a mirror serves them; none when it is gone or unreadable."""
    manifest = _stored_manifest(store_root, bundle_id)
    return {} if manifest is None else tags_doc(manifest.served_tags)

"""What the store offers its peers: the blobs it serves, and each bundle's holding.

Read without the store lock (a reader; ``StoreRecords.load(is_repairing=False)``): the
peer server reads an offer, serves from it for a few seconds, then reads it again. Only
blobs that are both listed by a bundle and stored are offered: by its record, or, for a
bundle being fetched (its signed ``bundle.json`` written, no record yet), by that
manifest, so a node re-serves each blob as soon as it is stored (verified). A bundle's
manifest digest is the sha256 of its ``bundle.json`` as stored (as signed). Registry sets
are not offered: they have no signed manifest a peer could check. The signature tags a
recorded bundle's manifest lists (``imageSignatures``, ``signatures.served_tags``) and the
tags it serves (``servedTags``, ``bundles.tags``) are offered with it, answered with their
listed (and stored) manifest, and no other tag.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.fetched import fetching_sizes
from nodeagent.adapters.store.records import StoreRecords, read_bundle_file
from nodeagent.adapters.store.source import store_files, stored_signature_tags
from nodeagent.bundles.manifest import ExpectedFile
from nodeagent.store import layout

FETCHING: Final = -1.0
"""``accepted_at_s`` of a bundle being fetched (no record yet)."""
FRESH_PARTIAL_S: Final = 30.0
"""A partial blob written to within this long is being fetched; an older one was left by a
cut transfer (it is resumed when its fetch runs again)."""


@dataclass(frozen=True, slots=True)
class OfferedBundle:
    bundle_id: str
    manifest_digest: str
    sizes: Mapping[str, int]
    """Digest → size of every blob the bundle lists (held or not)."""
    accepted_at_s: float
    """The record's acceptance time: a bundle accepted again may have a new manifest
    (``FETCHING`` for a bundle without a record yet)."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """``<repository>/<tag>`` → manifest digest: the signature tags of its signed images
    (``sha256-<hex>.sig``) and the tags its manifest serves (``servedTags``)."""


@dataclass(frozen=True, slots=True)
class StoreOffer:
    blobs: Mapping[str, ExpectedFile]
    """Digest → its file in the store, for every stored blob a bundle lists."""
    bundles: Mapping[str, OfferedBundle]
    stored: frozenset[str]
    tags: Mapping[str, str] = field(default_factory=dict)
    """Every offered bundle's tags whose manifest is offered (a tag two bundles list: the
    one accepted last)."""
    fetching: frozenset[str] = frozenset()
    """Blobs of bundles being fetched whose partial was written to lately (``have``)."""


def _manifest_digest(root: Path, bundle_id: str) -> str | None:
    manifest = read_bundle_file(root, bundle_id, layout.MANIFEST_NAME)
    return None if manifest is None else f"sha256:{hashlib.sha256(manifest).hexdigest()}"


def read_offer(
    root: Path, previous: StoreOffer | None = None, *, now_s: float | None = None
) -> StoreOffer:
    """The store as its peers see it now (blocking: run in a thread). A bundle whose record
    is the one ``previous`` was read from keeps its manifest digest (not hashed again).
    ``now_s``: the wall-clock time partials are judged fresh by (default: now)."""
    blob_store = BlobStore(root)
    stored = blob_store.stored()
    records = StoreRecords(root).load(is_repairing=False).records
    bundles: dict[str, OfferedBundle] = {}
    listed: dict[str, int] = {}
    for record in records:
        if record.is_registry:
            continue
        known = None if previous is None else previous.bundles.get(record.bundle_id)
        if known is not None and known.accepted_at_s == record.accepted_at_s:
            digest: str | None = known.manifest_digest
            tags = dict(known.tags)
        else:
            digest = _manifest_digest(root, record.bundle_id)
            tags = stored_signature_tags(root, record.bundle_id)
        if digest is None:
            continue
        sizes = {blob.digest: blob.size_bytes for blob in record.blobs}
        bundles[record.bundle_id] = OfferedBundle(
            record.bundle_id, digest, sizes, record.accepted_at_s, tags
        )
        listed |= {d: size for d, size in sizes.items() if stored.get(d) == size}
    fetched: set[str] = set()
    for bundle_id, sizes in fetching_sizes(root).items():
        if bundle_id in bundles:
            continue
        digest = _manifest_digest(root, bundle_id)
        if digest is not None:
            bundles[bundle_id] = OfferedBundle(bundle_id, digest, sizes, FETCHING)
            listed |= {d: size for d, size in sizes.items() if stored.get(d) == size}
            fetched |= set(sizes)
    fetching: frozenset[str] = frozenset()
    if fetched:
        since = (time.time() if now_s is None else now_s) - FRESH_PARTIAL_S
        partials = blob_store.partials()
        fetching = frozenset(d for d in fetched if d in partials and partials[d][1] >= since)
    # A tag two bundles list with different digests: the one accepted last answers it.
    newest_last = sorted(bundles.values(), key=lambda b: b.accepted_at_s)
    offered = {n: d for b in newest_last for n, d in b.tags.items() if d in listed}
    return StoreOffer(store_files(listed), bundles, frozenset(listed), offered, fetching)

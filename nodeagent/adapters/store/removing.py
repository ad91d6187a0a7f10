"""``bundle remove``: one bundle's blobs out of the store now, its signed manifest kept.

What the store's collector (``keeper.collect``) does to a released bundle after the grace
period, done at once for one bundle a technician names: its blobs that no other record
(another bundle, a registry set) and no fetch under way refers to are removed; the others
stay. Its ``bundle.json``, signature, record and release signatures stay, so the
anti-rollback marks (``adapters.store.accepted``) and the store's listing are unchanged:
the bundle reads as incomplete, as a collected one does (``site.discovery``), and plugging
its stick in again imports it again. The marks of the removed blobs go; ``index.json`` is
rewritten to name only images whose top manifest is still stored. Under the store's lock;
whether the bundle may go (its sets not pinned, a release not in use) is the caller's
rule (``cli.lifecycle``, decision 0072).
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass
from pathlib import Path

import structlog

from nodeagent.adapters.store.blobs import BlobStore, StoreLock
from nodeagent.adapters.store.fetched import fetching_digests
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.errors import BundleNotStored
from nodeagent.store.layout import BundleRecord
from nodeagent.strict import clip
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Removed:
    bundle_id: str
    removed_blobs: int
    freed_bytes: int
    kept_blobs: int
    """Blobs of the bundle another record or a fetch under way still refers to."""
    kept_bytes: int
    absent_blobs: int
    """Blobs of the bundle not stored (collected or removed before)."""


def stored_bundle(root: Path, bundle_id: str) -> BundleRecord:
    """The record of bundle ``bundle_id`` (not a registry set), or ``BundleNotStored``."""
    for record in StoreRecords(root).load(is_repairing=False).records:
        if record.bundle_id == bundle_id and not record.is_registry:
            return record
    raise BundleNotStored(
        f"the store {root} holds no bundle {clip(bundle_id, 130)} (nodeagent store lists them)"
    )


def held_digests(
    records: Iterable[BundleRecord], stored: Set[str], pinned_sets: Set[str], but: str
) -> set[str]:
    """The blobs the other records hold: those of every record (bundle or registry set)
    but ``but`` that is complete (every blob stored) or has a set in ``pinned_sets``. A
    bundle removed or collected before holds nothing: its record stays, its blobs went."""
    held: set[str] = set()
    for record in records:
        if record.bundle_id == but and not record.is_registry:
            continue
        if record.digests <= stored or not pinned_sets.isdisjoint(record.sets):
            held |= record.digests
    return held


def remove_bundle_blobs(root: Path, bundle_id: str, pinned_sets: Set[str]) -> Removed:
    """Remove bundle ``bundle_id``'s blobs but those another record holds
    (``held_digests``) or a fetch under way needs; ``pinned_sets``: the sets pinned now."""
    blobs, records = BlobStore(root), StoreRecords(root)
    with StoreLock(root):
        loaded = records.load(is_repairing=False)
        record = stored_bundle(root, bundle_id)
        stored = blobs.stored()
        keep = held_digests(loaded.records, set(stored), pinned_sets, bundle_id)
        keep |= fetching_digests(root)
        removed = kept = absent = 0
        freed = kept_bytes = 0
        for digest in sorted(record.digests):
            if digest not in stored:
                absent += 1
            elif digest in keep:
                kept, kept_bytes = kept + 1, kept_bytes + stored[digest]
            elif blobs.remove(digest):
                removed, freed = removed + 1, freed + stored[digest]
        left = set(blobs.stored())
        records.save_marks({d: at for d, at in records.load_marks().items() if d in left})
        records.refresh_index(loaded.records, left)
    log.info(
        "bundle_blobs_removed",
        bundle=bundle_id,
        blobs=removed,
        freed=format_bytes(freed),
        kept_shared=kept,
        message=f"removed bundle {bundle_id}'s blobs by hand; its signed manifest stays",
    )
    return Removed(bundle_id, removed, freed, kept, kept_bytes, absent)

"""What the store keeps (``inspect_store``), removing the rest (``collect``), ``verify``.

A blob found damaged elsewhere (the peer server, while sending it) goes the way ``verify``
sends one (``set_aside_corrupt``): checked again under the store's lock, removed, and the
index rewritten, so the records that list it read as incomplete and the bundle is fetched
or imported again where it can be.

The rules are ``nodeagent.store.keeping``'s; this module reads the records, the blobs and
the marks, and applies the plan: a blob is removed only after ``gc_grace_s`` unreferenced
(its mark, the time it was first found so, is kept in ``gc-marks.json``); a partial blob
nothing refers to goes once it is older than the grace period. The blobs of a bundle
being fetched (``fetched.fetching_digests``) and their partials are kept while it is. The
signed manifests and records are never removed; a registry set's record (no signature,
nothing to keep it for) goes once the set is released. ``index.json`` is rewritten
afterwards so it names only images whose top manifest is still stored.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import structlog

from nodeagent.adapters.store.blobs import BlobStore, StoreLock
from nodeagent.adapters.store.fetched import fetching_digests
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.adapters.store.source import stored_frozen_tags
from nodeagent.errors import StoreBlobCorrupt, StoreBlobMissing
from nodeagent.store.keeping import (
    BundleVerdict,
    KeepRules,
    RemovalPlan,
    decide,
    plan_removals,
    referenced,
)
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)

VERIFY_THREADS: Final = 4
"""Blobs ``verify`` hashes at once, at most (and at most the CPUs): SHA-256 with the CPU's
SHA instructions outruns one thread's reads, and ``openssl dgst`` is one thread
(docs/performance.md, "Store verify")."""


@dataclass(frozen=True)
class StoreView:
    """The store as ``nodeagent store`` shows it: each bundle with its verdict, the space."""

    root: Path
    verdicts: tuple[BundleVerdict, ...]
    stored: dict[str, int]
    """Digest → size of every stored blob."""
    removals: RemovalPlan
    partial_bytes: int
    repairs: tuple[str, ...] = ()
    fetching: frozenset[str] = frozenset()
    """Blobs of the bundles being fetched (signed manifest, no record yet): kept, with
    their partials, until the fetch ends."""
    frozen_tags: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Bundle id → the tags it serves (``host/repository:tag`` → digest), frozen while a
    mirror serves them (``bundles.tags``): read only for ``nodeagent store``."""

    @property
    def stored_bytes(self) -> int:
        return sum(self.stored.values())

    @property
    def releasable_bytes(self) -> int:
        """Blobs nothing kept refers to (removed after the grace period)."""
        gone = set(self.removals.marks) | set(self.removals.remove)
        return sum(size for digest, size in self.stored.items() if digest in gone)

    def own_bytes(self, verdict: BundleVerdict) -> tuple[int, int]:
        """(bytes only this bundle refers to, bytes it shares with other bundles), stored."""
        others = {d for v in self.verdicts if v is not verdict for d in v.record.digests}
        own = shared = 0
        for digest in verdict.record.digests:
            size = self.stored.get(digest, 0)
            if digest in others:
                shared += size
            else:
                own += size
        return own, shared

    def _frozen(self, bundle_id: str) -> dict[str, Any]:
        tags = self.frozen_tags.get(bundle_id)
        return {"frozenTags": dict(tags)} if tags else {}

    def to_json(self) -> dict[str, Any]:
        bundles = []
        for verdict in self.verdicts:
            record = verdict.record
            own, shared = self.own_bytes(verdict)
            bundles.append(
                {
                    "source": record.source,
                    "bundleId": record.bundle_id,
                    "keyId": record.key_id,
                    "keyName": record.key_name,
                    "channel": record.channel,
                    "created": record.created,
                    "sequence": record.sequence,
                    "kept": verdict.is_kept,
                    "reasons": list(verdict.reasons),
                    "why": verdict.describe(),
                    "pinnedSets": list(verdict.pinned_sets),
                    "sets": list(record.sets),
                    "images": [image.name for image in record.images],
                    "sizeBytes": record.size_bytes,
                    "ownBytes": own,
                    "sharedBytes": shared,
                }
                | self._frozen(record.bundle_id)
            )
        return {
            "path": str(self.root),
            "storedBytes": self.stored_bytes,
            "blobs": len(self.stored),
            "releasableBytes": self.releasable_bytes,
            "partialBytes": self.partial_bytes,
            "removals": [
                {"digest": d, "sizeBytes": self.stored.get(d, 0), "removeAt": round(at)}
                for d, at in sorted(self.removals.held.items())
            ],
            "bundles": bundles,
            "repairs": list(self.repairs),
        }


def inspect_store(
    root: Path,
    pinned_sets: Iterable[str],
    rules: KeepRules,
    now_s: float,
    *,
    is_repairing: bool = False,
    with_tags: bool = False,
    self_digests: frozenset[str] = frozenset(),
) -> StoreView:
    """What is kept and why: read only (nothing marked, removed or repaired) unless
    ``is_repairing`` (the caller holds the store lock). ``with_tags``: each bundle's signed
    manifest is read for the tags it serves (``frozen_tags``). ``self_digests``: nodeagent's
    own image, kept by the set ``nodeagent-self`` (``keeping.decide``)."""
    blobs, records = BlobStore(root), StoreRecords(root)
    loaded = records.load(is_repairing=is_repairing)
    verdicts = decide(loaded.records, pinned_sets, rules, now_s, self_digests)
    stored = blobs.stored()
    fetching = fetching_digests(root)
    keep = referenced(verdicts) | fetching
    plan = plan_removals(stored, keep, records.load_marks(), rules.gc_grace_s, now_s)
    partial_bytes = sum(size for size, _ in blobs.partials().values())
    frozen = {
        v.record.bundle_id: stored_frozen_tags(root, v.record.bundle_id)
        for v in verdicts
        if with_tags and not v.record.is_registry
    }
    view = StoreView(root, verdicts, stored, plan, partial_bytes, loaded.repairs, fetching)
    return replace(view, frozen_tags={k: v for k, v in frozen.items() if v})


@dataclass(frozen=True)
class Collected:
    removed: tuple[str, ...]
    freed_bytes: int
    view: StoreView


def collect(
    root: Path,
    pinned_sets: Iterable[str],
    rules: KeepRules,
    now_s: float | None = None,
    self_digests: frozenset[str] = frozenset(),
) -> Collected:
    """Mark unreferenced blobs, remove those marked a grace period ago, rewrite the index."""
    now_s = time.time() if now_s is None else now_s
    blobs, records = BlobStore(root), StoreRecords(root)
    with StoreLock(root):
        view = inspect_store(
            root, pinned_sets, rules, now_s, is_repairing=True, self_digests=self_digests
        )
        freed = 0
        for digest in view.removals.remove:
            if blobs.remove(digest):
                freed += view.stored[digest]
        keep = referenced(view.verdicts) | view.fetching
        for digest, (_size, mtime) in blobs.partials().items():
            if digest not in keep and now_s - mtime >= rules.gc_grace_s:
                blobs.remove_partial(digest)
        records.save_marks(view.removals.marks)
        for verdict in view.verdicts:
            if verdict.record.is_registry and not verdict.is_kept:
                records.remove_set(verdict.record.bundle_id)  # its blobs are marked above
        kept = [v.record for v in view.verdicts if v.is_kept or not v.record.is_registry]
        records.refresh_index(kept, set(blobs.stored()))
    if view.removals.remove:
        log.info("store_blobs_removed", blobs=len(view.removals.remove), freed=format_bytes(freed))
    return Collected(view.removals.remove, freed, view)


def discard(root: Path, digests: Iterable[str]) -> tuple[int, int]:
    """Remove at once those of ``digests`` no stored bundle or set lists and no fetch wants:
    the blobs a refused import's copy stored (decision 0081). A blob another bundle lists
    stays, whatever its verdict: the keeper decides for those. Returns the blobs removed
    and their bytes."""
    blobs, records = BlobStore(root), StoreRecords(root)
    with StoreLock(root):
        loaded = records.load(is_repairing=False)
        listed = {blob.digest for record in loaded.records for blob in record.blobs}
        keep = listed | fetching_digests(root)
        stored = blobs.stored()
        removed = [d for d in sorted(set(digests)) if d not in keep and d in stored]
        freed = sum(stored[d] for d in removed if blobs.remove(d))
        if removed:
            records.refresh_index(loaded.records, set(blobs.stored()))
    return len(removed), freed


@dataclass(frozen=True)
class Verified:
    """``verify``'s answer: every stored blob hashed; the corrupt ones, removed."""

    checked: int
    checked_bytes: int
    corrupt: tuple[tuple[str, str], ...]
    """(digest, message) of each blob that failed its digest (and was removed)."""
    seconds: float

    @property
    def is_ok(self) -> bool:
        return not self.corrupt

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.is_ok,
            "checkedBlobs": self.checked,
            "checkedBytes": self.checked_bytes,
            "seconds": round(self.seconds, 3),
            "corrupt": [
                {"digest": digest, "reason": StoreBlobCorrupt.reason, "message": message}
                for digest, message in self.corrupt
            ],
        }


def verify(
    root: Path,
    on_bytes: Callable[[int, int], None] = lambda _done, _total: None,
    clock: Callable[[], float] = time.monotonic,
    threads: int | None = None,
) -> Verified:
    """Re-hash every stored blob; remove (and report) each that no longer matches its digest.

    Blobs are hashed ``threads`` at a time (default: ``VERIFY_THREADS``, at most the CPUs),
    the largest first, so one big blob does not end the run alone; ``on_bytes`` is called
    from those threads, one call at a time."""
    started_s = clock()
    blobs, records = BlobStore(root), StoreRecords(root)
    corrupt: list[tuple[str, str]] = []
    done = 0
    counting = threading.Lock()
    with StoreLock(root):
        stored = blobs.stored()
        total = sum(stored.values())

        def count(n: int) -> None:
            nonlocal done
            with counting:
                done += n
                on_bytes(done, total)

        def check(digest: str) -> StoreBlobCorrupt | None:
            try:
                blobs.check(digest, count)
            except StoreBlobCorrupt as err:
                return err
            return None

        largest_first = sorted(stored, key=lambda digest: (-stored[digest], digest))
        workers = max(1, min(threads or VERIFY_THREADS, os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verify") as pool:
            verdicts = dict(zip(largest_first, pool.map(check, largest_first), strict=True))
        for digest in sorted(stored):
            err = verdicts[digest]
            if err is not None:
                _remove_corrupt(blobs, digest, err)
                corrupt.append((digest, err.message))
        if corrupt:
            records.refresh_index(records.load().records, set(blobs.stored()))
    return Verified(len(stored), done, tuple(corrupt), clock() - started_s)


def _remove_corrupt(blobs: BlobStore, digest: str, err: StoreBlobCorrupt) -> None:
    blobs.remove(digest)
    log.error("store_blob_corrupt", digest=digest, reason=err.reason, error=err.message)


def set_aside_corrupt(root: Path, digest: str) -> bool:
    """A blob reported damaged outside ``verify``: hashed again under the store's lock (a
    report is not proof, and the blob may have been stored anew since) and, still damaged,
    removed as ``verify`` removes it, the index rewritten. True when it was removed."""
    blobs, records = BlobStore(root), StoreRecords(root)
    with StoreLock(root):
        try:
            blobs.check(digest)
        except StoreBlobMissing:
            return False
        except StoreBlobCorrupt as err:
            _remove_corrupt(blobs, digest, err)
            records.refresh_index(records.load().records, set(blobs.stored()))
            return True
    return False

"""What the store holds, at bundle granularity, for the node's published holdings.

``StoreHoldings.scan`` reads (without the store lock, repairing nothing) every bundle's
record, the blobs stored, the sha256 of each stored ``bundle.json`` and the target it names
(parsed once per file identity); a bundle directory
with a signed ``bundle.json`` and its signature but no record yet is a fetch under way
and is listed as started (its manifest parsed for the totals). The digests are kept per
file identity (inode, size, mtime), so a rescan that finds nothing new reads no manifest
again. The file is read as the peer server reads it (``records.read_bundle_file``: beneath
the store, no link followed, bounded), so both publish the same digest. Blocking: the
publisher runs it in a worker thread.

Two scans, on purpose: this one (for the cluster's NodeImageHoldings) also lists bundles
being fetched (a manifest, no record yet) and caches by file identity; ``offer.read_offer``
(for the peer server) lists only recorded bundles and the stored blobs they allow, which is
what may be served. Both read the records and the stored blobs the same way
(``StoreRecords.load(is_repairing=False)``, ``BlobStore.stored``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.records import StoreRecords, has_signature, read_bundle_file
from nodeagent.bundles.manifest import MAX_MANIFEST_BYTES, parse_manifest
from nodeagent.bundles.target import MAX_SELECTOR_CHARS
from nodeagent.cluster.holdings import HeldBundle, HeldTarget
from nodeagent.errors import HostFileError, NodeAgentError
from nodeagent.site.discovery import held_bundles
from nodeagent.store import layout

_Identity = tuple[int, int, int]


class StoreHoldings:
    """``site.publishing.HoldingsSource`` over the store directory ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._digests: dict[str, tuple[_Identity, str, HeldBundle | None]] = {}
        """bundle id → (file identity, digest, the manifest as a started bundle)."""

    def scan(self) -> tuple[HeldBundle, ...]:
        if not (self.root / layout.BUNDLES_DIR).is_dir():
            return ()
        records = StoreRecords(self.root).load(is_repairing=False).records
        recorded = {r.bundle_id for r in records}
        digests: dict[str, str] = {}
        started: list[HeldBundle] = []
        targets: dict[str, HeldTarget] = {}
        for bundle_id in self._bundle_ids():
            read = self._manifest(bundle_id)
            if read is None:
                continue
            digest, held = read
            digests[bundle_id] = digest
            if held is not None and held.target is not None:
                targets[bundle_id] = held.target
            if held is not None and bundle_id not in recorded:
                started.append(held)
        self._digests = {k: v for k, v in self._digests.items() if k in digests}
        stored = BlobStore(self.root).stored()
        return held_bundles(records, stored, digests, started, targets)

    def _bundle_ids(self) -> list[str]:
        directory = self.root / layout.BUNDLES_DIR
        try:
            names = sorted(e.name for e in os.scandir(directory) if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []
        except OSError as err:
            raise HostFileError(f"cannot list {directory}: {err.strerror}") from err
        return [name for name in names if layout.is_bundle_id(name)]

    def _manifest(self, bundle_id: str) -> tuple[str, HeldBundle | None] | None:
        """The digest of the bundle's ``bundle.json`` and the manifest as a started bundle
        (its totals and target; None: not a manifest of that id); None: no manifest or
        signature (yet)."""
        directory = self.root / layout.bundle_dir(bundle_id)
        path = directory / layout.MANIFEST_NAME
        try:
            info = path.stat(follow_symlinks=False)
            is_signed = has_signature(directory)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise HostFileError(f"cannot read {path}: {err.strerror}") from err
        if not is_signed or info.st_size > MAX_MANIFEST_BYTES:
            return None
        identity = (info.st_ino, info.st_size, info.st_mtime_ns)
        cached = self._digests.get(bundle_id)
        if cached is not None and cached[0] == identity:
            return cached[1], cached[2]
        data = read_bundle_file(self.root, bundle_id, layout.MANIFEST_NAME)
        if data is None:
            return None
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        started = _started(bundle_id, digest, data)
        self._digests[bundle_id] = (identity, digest, started)
        return digest, started


def _started(bundle_id: str, digest: str, data: bytes) -> HeldBundle | None:
    """A bundle being fetched, from its manifest's totals; None: not a manifest of that id."""
    try:
        manifest = parse_manifest(data)
    except NodeAgentError:
        return None
    if manifest.bundle_id != bundle_id:
        return None
    size = sum(f.size_bytes for f in manifest.blobs.values())
    text = manifest.target.selector_text if manifest.target is not None else ""
    # The canonical text of a selector bound at 4 KiB in bundle.json could grow past it
    # (terms written once each, with their own spacing): then no target is published,
    # which the site view treats as not known, never as "every node".
    target = HeldTarget(manifest.architecture, text) if len(text) <= MAX_SELECTOR_CHARS else None
    return HeldBundle(bundle_id, digest, False, len(manifest.blobs), size, target)

"""The release bundles the store holds, and unpinning one (``cluster.retiring``'s ports).

``StoredReleases.held`` reads each recorded bundle's stored ``bundle.json`` (the bytes
verified when the bundle was accepted; read beneath the store, no link followed, bounded:
``records.read_bundle_file``) and lists those that carry a ``release`` (format 3,
docs/bundle-format.md#release): its version, release image digest and set, and whether
the set's spec file (``bundle-<id>-<set>.yaml``, ``handover.set_file_name``) is still in a
spec directory. ``unpin`` removes that file from every spec directory: the daemon's inotify
watch starts a sync, which unpins the set; the store collects its blobs after
``[store] gc_grace_s`` (``store.keeping``: nothing pinned keeps them). The signed manifest,
its signature, record and release signatures stay: the anti-rollback marks are derived
from them (``adapters.store.accepted``). Blocking: the task runs both in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import structlog

from nodeagent.adapters.store.records import StoreRecords, read_bundle_file
from nodeagent.bundles.handover import set_file_name
from nodeagent.bundles.manifest import check_file_name, parse_manifest
from nodeagent.cluster.retirement import HeldRelease
from nodeagent.errors import HostFileError, NodeAgentError
from nodeagent.store import layout

log = structlog.get_logger(__name__)


class StoredReleases:
    """``cluster.retiring.ReleaseStore`` over the store at ``root`` and the spec directories."""

    def __init__(self, root: Path, spec_dirs: Sequence[Path]) -> None:
        self.root = root
        self.spec_dirs = tuple(spec_dirs)

    def held(self) -> tuple[HeldRelease, ...]:
        if not (self.root / layout.BUNDLES_DIR).is_dir():
            return ()
        records = StoreRecords(self.root).load(is_repairing=False).records
        found = []
        for record in records:
            if record.is_registry:
                continue
            held = self._release(record.bundle_id)
            if held is not None:
                found.append(held)
        return tuple(found)

    def _release(self, bundle_id: str) -> HeldRelease | None:
        data = read_bundle_file(self.root, bundle_id, layout.MANIFEST_NAME)
        if data is None:
            return None
        try:
            manifest = parse_manifest(data)
        except NodeAgentError as exc:
            log.warning(
                "stored_manifest_unreadable", bundle=bundle_id, reason=exc.reason, error=exc.message
            )
            return None
        release = manifest.release
        if release is None or manifest.bundle_id != bundle_id:
            return None
        file_name = set_file_name(bundle_id, release.set_name)
        return HeldRelease(
            bundle_id,
            release.version,
            release.image.digest,
            release.set_name,
            is_pinned=any((d / file_name).is_file() for d in self.spec_dirs),
            image=str(release.image),
        )

    def unpin(self, held: HeldRelease) -> list[Path]:
        """Remove the release set's spec file from every spec directory; the paths removed."""
        file_name = check_file_name(set_file_name(held.bundle_id, held.set_name))
        removed = []
        for directory in self.spec_dirs:
            path = directory / file_name
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as err:
                raise HostFileError(f"cannot remove {path}: {err.strerror}") from err
            removed.append(path)
            with contextlib.suppress(OSError):
                fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        return removed

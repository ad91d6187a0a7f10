"""The release bundles the store holds, and unpinning one: the one reader of them.

``StoredReleases.held`` reads each recorded bundle's stored ``bundle.json`` (the bytes
verified when the bundle was accepted; read beneath the store, no link followed, bounded:
``records.read_bundle_file``) and lists those that carry a ``release`` (format 3,
docs/bundle-format.md#release): its version, release image digest, set and the versions it
upgrades from, and whether the set's spec file (``bundle-<id>-<set>.yaml``,
``handover.set_file_name``) is still in a spec directory. Both the status
(``releases.release_reports``, judged against the cluster's version) and retirement
(``cluster.retiring``) read through it. The manifests are parsed again only when a bundle's
record or manifest file changed (inode, time, size), so a status written every few seconds
costs a directory listing and a few ``stat`` calls.

``unpin`` removes the set's spec file from every spec directory: the daemon's inotify watch
starts a sync, which unpins the set; the store collects its blobs after ``[store]
gc_grace_s`` (``store.keeping``: nothing pinned keeps them). The signed manifest, its
signature, record and release signatures stay: the anti-rollback marks are derived from
them (``adapters.store.accepted``). Blocking: the retirement task runs it in a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import structlog

from nodeagent.adapters.store.records import StoreRecords, read_bundle_file
from nodeagent.bundles.handover import set_file_name
from nodeagent.bundles.manifest import check_file_name, parse_manifest
from nodeagent.errors import HostFileError, NodeAgentError
from nodeagent.releases import HeldRelease
from nodeagent.store import layout

log = structlog.get_logger(__name__)

_Stamp = tuple[int, int, int] | None
_Key = tuple[tuple[str, _Stamp, _Stamp], ...]


class StoredReleases:
    """``cluster.retiring.ReleaseStore`` over the store at ``root`` and the spec directories."""

    def __init__(self, root: Path, spec_dirs: Sequence[Path]) -> None:
        self.root = root
        self.spec_dirs = tuple(spec_dirs)
        self._key: _Key | None = None
        self._carried: tuple[HeldRelease, ...] = ()

    def held(self) -> tuple[HeldRelease, ...]:
        key = self._stamps()
        if key != self._key:
            self._carried = self._read()
            self._key = key
        return tuple(replace(h, is_pinned=self._is_pinned(h)) for h in self._carried)

    def _stamps(self) -> _Key:
        """Each bundle directory's record and manifest (inode, mtime, size): what ``_read``
        depends on; an unreadable ``bundles/`` reads as no bundle (``_read`` says why)."""
        bundles = self.root / layout.BUNDLES_DIR
        try:
            names = sorted(e.name for e in os.scandir(bundles))
        except OSError:
            return ()
        return tuple(
            (name, _stamp(bundles / name / layout.RECORD_NAME),
             _stamp(bundles / name / layout.MANIFEST_NAME))
            for name in names
        )  # fmt: skip

    def _read(self) -> tuple[HeldRelease, ...]:
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
        return HeldRelease(
            bundle_id,
            release.version,
            release.image.digest,
            release.set_name,
            image=str(release.image),
            previous=tuple(release.previous),
        )

    def _is_pinned(self, held: HeldRelease) -> bool:
        file_name = set_file_name(held.bundle_id, held.set_name)
        return any((d / file_name).is_file() for d in self.spec_dirs)

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
            _sync_directory(directory)
        return removed


def _stamp(path: Path) -> _Stamp:
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _sync_directory(directory: Path) -> None:
    """Make the removal durable; a directory that cannot be synced is logged, the removal
    stands (the sync that follows reads the directory as it is)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        log.debug("spec_dir_not_synced", path=str(directory), error=err.strerror)

"""A stored release bundle's signature files, by the paths its verified manifest lists.

The peer server answers ``release-signature`` requests with them. Each is read by the
manifest's own path and entry, never by the path asked for, and checked against its size
and sha256. Which paths are listed comes from the bundle's ``bundle.json`` (up to 16 MiB).
It is parsed once per version of the file: its ``FileStamp`` (device, inode, size, mtime,
ctime) is compared at each request, and the file is read and parsed again only when it
changed. Before, every request parsed it again, on the shared worker threads (issue 24,
finding 5). A manifest that does not parse is remembered as listing nothing.

At most ``MAX_BUNDLES`` listings are kept, the least recently used dropped first. A
listing is a few paths with their sizes and digests. Thread-safe: requests read in
worker threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from nodeagent.adapters.bundles.tree import BundleDir, FileStamp
from nodeagent.bundles.manifest import (
    MAX_MANIFEST_BYTES,
    BundleError,
    BundleManifest,
    ExpectedFile,
    parse_manifest,
)
from nodeagent.errors import HostFileError
from nodeagent.store import layout

MAX_BUNDLES: Final = 64
"""Listings kept; a store holds a few release bundles."""

Listing = Mapping[str, ExpectedFile]
"""Listed signature path → the file to read beneath the store, with its size and digest."""


def _listing(bundle_id: str, manifest: BundleManifest) -> dict[str, ExpectedFile]:
    release = manifest.release
    listed = {f.path: f for f in manifest.files}
    files = {}
    for signature in release.signatures if release is not None else ():
        entry = listed.get(signature.path)
        if entry is not None:
            where = f"{layout.bundle_dir(bundle_id)}/{entry.path}"
            files[signature.path] = ExpectedFile(where, entry.size_bytes, entry.sha256_hex)
    return files


class ReleaseSignatureFiles:
    """The release signature files of the store at ``root`` (see the module docstring)."""

    def __init__(self, root: Path, *, max_bundles: int = MAX_BUNDLES) -> None:
        self.root, self.max_bundles = root, max_bundles
        self._listings: OrderedDict[str, tuple[FileStamp, Listing]] = OrderedDict()
        self._lock = threading.Lock()
        self.manifests_parsed = 0
        """How many times a ``bundle.json`` was parsed (the attack test counts them)."""

    def read(self, bundle_id: str, path: str) -> bytes | None:
        """The file the bundle's stored manifest lists as release signature ``path``,
        checked; None when not listed, absent, damaged or a link (blocking: a thread)."""
        if not layout.is_bundle_id(bundle_id):
            return None
        file = self.listing(bundle_id).get(path)
        if file is None:
            return None
        try:
            with BundleDir(self.root) as store:
                return store.read_listed(file)
        except (BundleError, HostFileError):
            return None

    def listing(self, bundle_id: str) -> Listing:
        """The bundle's listed signature files, from its ``bundle.json`` as it is now."""
        with self._lock:
            known = self._listings.get(bundle_id)
        where = f"{layout.bundle_dir(bundle_id)}/{layout.MANIFEST_NAME}"
        try:
            with BundleDir(self.root) as store:
                read = store.read_small_stamped(
                    where, MAX_MANIFEST_BYTES, unless=None if known is None else known[0]
                )
        except BundleError:  # a link or another unsafe entry: never read
            read = None
        if read is None:
            self._forget(bundle_id)
            return {}
        stamp, data = read
        if data is None and known is not None:
            with self._lock:
                if bundle_id in self._listings:
                    self._listings.move_to_end(bundle_id)
            return known[1]
        return self._remember(bundle_id, stamp, self._parse(bundle_id, data))

    def _parse(self, bundle_id: str, data: bytes | None) -> Listing:
        with self._lock:
            self.manifests_parsed += 1
        if data is None or len(data) > MAX_MANIFEST_BYTES:
            return {}
        try:
            return _listing(bundle_id, parse_manifest(data))
        except BundleError:
            return {}

    def _remember(self, bundle_id: str, stamp: FileStamp, listing: Listing) -> Listing:
        with self._lock:
            self._listings[bundle_id] = (stamp, listing)
            self._listings.move_to_end(bundle_id)
            while len(self._listings) > self.max_bundles:
                self._listings.popitem(last=False)
        return listing

    def _forget(self, bundle_id: str) -> None:
        with self._lock:
            self._listings.pop(bundle_id, None)

"""``bundle create --dry-run``: what a bundle would hold and need, with nothing written.

It runs ``bundle create``'s own planning step (``writer.plan_bundle``: the release's images
and set, the bundle id, each image's manifests and config) with its fetcher pointed at a
scratch directory removed afterwards, so the output directory is never touched; the layers
are not fetched, their sizes come from the manifests. With ``--with-signatures`` each
image's sigstore signature is fetched into the scratch directory too (a few KB each).

What the target needs: every file the bundle would hold (blobs, layout files, the
release's signature files, ``bundle.json`` and its signature, exact sizes), each rounded
up to the target filesystem's block size (``f_frsize``), against the space free there for
an unprivileged writer (``f_bavail``). The target is the output directory or, when it does
not exist yet, its nearest existing parent (the filesystem it would be made on). Blobs an
interrupted create left in the output are not subtracted: the figure is what an empty
medium needs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from nodeagent.adapters.bundles import writer
from nodeagent.adapters.bundles.fetcher import ImageFetcher, PlannedImage
from nodeagent.adapters.bundles.release import ReleaseRequest
from nodeagent.adapters.bundles.sigstore import CarriedSignature, fetch_signature
from nodeagent.adapters.files import DiskFigures, statvfs_free
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.authfile import AuthStore
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles import minisign
from nodeagent.bundles import release as releases
from nodeagent.bundles.freshness import Freshness
from nodeagent.bundles.tags import ServedTag
from nodeagent.bundles.target import BundleTarget
from nodeagent.references import PinnedImageRef
from nodeagent.specs import PinnedImageSet

_SIZING_KEY = minisign.SecretKey(bytes(minisign.KEY_ID_BYTES), bytes(32))
"""Signs nothing kept: a ``.minisig``'s length depends on its comments only, not its key."""


@dataclass(frozen=True, slots=True)
class DryRun:
    """What ``bundle create`` would write to ``output``, and whether it fits there."""

    bundle_id: str
    output: Path
    measured_at: Path
    """Where free space was measured: the output, or its nearest existing parent."""
    images: tuple[PlannedImage, ...]
    blob_count: int
    size_bytes: int
    """Every file the bundle would hold, exact (what ``bundle verify`` hashes, plus
    ``bundle.json`` and its signature)."""
    needed_bytes: int
    """``size_bytes`` with each file rounded up to the target's block size."""
    disk: DiskFigures
    block_bytes: int
    release: releases.BundleRelease | None = None
    payload_count: int = 0
    signatures: tuple[CarriedSignature, ...] = ()

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.disk.available_bytes


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (resolved)."""
    current = path.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current.resolve()


def rounded(size_bytes: int, block_bytes: int) -> int:
    """``size_bytes`` rounded up to whole blocks (an empty file takes none)."""
    return -(-size_bytes // block_bytes) * block_bytes if block_bytes > 0 else size_bytes


async def dry_run(
    refs: Sequence[PinnedImageRef],
    sets: Sequence[PinnedImageSet],
    output_dir: Path,
    *,
    client: RegistryClient,
    auth: AuthStore,
    now: datetime,
    freshness: Freshness,
    bundle_id: str | None = None,
    target: BundleTarget | None = None,
    release: ReleaseRequest | None = None,
    with_signatures: bool = False,
    served_tags: Sequence[ServedTag] = (),
) -> DryRun:
    """Plan the bundle as ``writer.create_bundle`` would, in a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="nodeagent-dry-run-") as scratch:
        fetcher = ImageFetcher(client, auth, Path(scratch), None)
        planned = await writer.plan_bundle(
            fetcher, refs, sets, bundle_id=bundle_id, target=target, release=release
        )
        found = []
        if with_signatures:
            found = [await fetch_signature(fetcher, i) for i in planned.images]
    signatures = tuple(s for s in found if s is not None)
    created = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    files = writer.layout_files(planned.images) | planned.extra
    doc = writer.manifest_doc(
        bundle_id=planned.bundle_id, created=created, architecture=client.platform.architecture,
        images=planned.images, files=files, sets=planned.sets, target=target,
        freshness=freshness, release=planned.release, signatures=signatures,
        served_tags=served_tags,
    )  # fmt: skip
    comment = f"nodeagent bundle {planned.bundle_id} created {created}"
    signature = minisign.sign(doc, _SIZING_KEY, trusted_comment=comment).encode()
    manifest = bundle.parse_manifest(doc)
    sizes = [f.size_bytes for f in manifest.files] + [len(doc), len(signature)]
    measured_at = nearest_existing(output_dir)
    disk = statvfs_free(measured_at)
    block_bytes = _block_bytes(measured_at)
    return DryRun(
        planned.bundle_id, output_dir, measured_at, planned.images, len(manifest.blobs),
        sum(sizes), sum(rounded(s, block_bytes) for s in sizes), disk, block_bytes,
        planned.release, planned.payload_count, signatures,
    )  # fmt: skip


def _block_bytes(path: Path) -> int:
    return os.statvfs(path).f_frsize

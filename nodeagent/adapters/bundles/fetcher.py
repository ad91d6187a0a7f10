"""Fetching a bundle's images from the registry: the plan of each image, then its blobs.

The plan of an image is what its digest names: the manifest, for a multi-arch index
also the one child for the bundle's platform (the one the runtime would pick), and its
config; a config of another platform is refused. Blobs go into the bundle's
``blobs/sha256/``, each once, streamed from the registry through sha256 into a
temporary file, fsynced and renamed into place. A blob an interrupted earlier run left
behind is kept when it hashes right. Before the layers, their total size is checked
against the output's free space.

Blobs are fetched one at a time: ``progress`` is called from the fetching thread. The
bundle around them is made by ``nodeagent.adapters.bundles.writer``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.authfile import AuthStore
from nodeagent.bundles.content import IMAGE_CONFIG_TYPES
from nodeagent.errors import ImageNotFound, InsufficientDiskSpace
from nodeagent.references import PinnedImageRef
from nodeagent.registries import (
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
    ManifestIndex,
    Platform,
    read_image_config_platform,
    read_manifest,
    select_platform,
)
from nodeagent.registries import Descriptor as Checked
from nodeagent.strict import clip
from nodeagent.units import format_bytes


class Progress(Protocol):
    def __call__(
        self, blobs_done: int, blobs_total: int, bytes_done: int, bytes_total: int
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Descriptor:
    media_type: str
    digest: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class PlannedImage:
    """One image of the bundle: the manifest its digest names and every blob it needs."""

    ref: PinnedImageRef
    manifests: tuple[Descriptor, ...]
    """What ``ref.digest`` names (an image manifest or an index), then the index's child."""
    config: Descriptor
    layers: tuple[Descriptor, ...]

    @property
    def manifest(self) -> Descriptor:
        return self.manifests[0]

    @property
    def blobs(self) -> tuple[Descriptor, ...]:
        """Every blob of the image, each digest once."""
        unique = {b.digest: b for b in (*self.manifests, self.config, *self.layers)}
        return tuple(unique.values())

    @property
    def size_bytes(self) -> int:
        return sum(blob.size_bytes for blob in self.blobs)


# ---------------------------------------------------------------- pure helpers
# Manifest bodies and configs are read by ``registries.read_manifest`` and
# ``registries.read_image_config_platform``: strict JSON, bounded, every field checked.
def _descriptor(checked: Checked) -> Descriptor:
    return Descriptor(checked.media_type, checked.digest, checked.size_bytes)


def image_blobs(body: bytes, ref: PinnedImageRef) -> tuple[Descriptor, ...]:
    """Config and layers of an image manifest body."""
    manifest = read_manifest(body, ref=str(ref))
    if manifest.is_index or manifest.config is None:
        raise ImageNotFound(f"{ref}: its index names another index, not an image manifest")
    return (_descriptor(manifest.config), *map(_descriptor, manifest.layers))


def top_descriptor(digest: str, body: bytes, ref: PinnedImageRef) -> Descriptor:
    """The descriptor of a fetched manifest: its own ``mediaType``, else OCI's for its shape."""
    manifest = read_manifest(body, ref=str(ref))
    fallback = MEDIA_TYPE_OCI_INDEX if manifest.is_index else MEDIA_TYPE_OCI_MANIFEST
    return Descriptor(manifest.media_type or fallback, digest, len(body))


def index_child(body: bytes, platform: Platform, ref: PinnedImageRef) -> Descriptor | None:
    """For an index body, the entry for ``platform`` (the runtime picks the same); else None."""
    manifest = read_manifest(body, ref=str(ref))
    if not manifest.is_index:
        return None
    entries = tuple((d.digest, d.platform or Platform("", "")) for d in manifest.manifests)
    digest = select_platform(ManifestIndex(entries), platform, ref=str(ref))
    return next(_descriptor(d) for d in manifest.manifests if d.digest == digest)


def _check_platform(config_body: bytes, platform: Platform, ref: PinnedImageRef) -> None:
    found = read_image_config_platform(config_body, ref=str(ref))
    if found != (platform.os, platform.architecture):
        os_name, architecture = clip(found[0], 64), clip(found[1], 64)
        raise ImageNotFound(
            f"{ref} is a {os_name}/{architecture} image and the bundle is for {platform}: give "
            f"the digest of its {platform} image, or make the bundle with --arch {architecture}"
        )


# ---------------------------------------------------------------- blob files (blocking)
def _is_present(path: Path, blob: Descriptor | str) -> bool:
    """Whether ``path`` holds ``blob`` already (an interrupted run fetched it)."""
    digest = blob if isinstance(blob, str) else blob.digest
    try:
        if not isinstance(blob, str) and path.stat().st_size != blob.size_bytes:
            return False
        with path.open("rb") as stream:
            return "sha256:" + hashlib.file_digest(stream, "sha256").hexdigest() == digest
    except FileNotFoundError:
        return False


def _commit(stream: IO[bytes], tmp: Path, final: Path) -> None:
    stream.flush()
    os.fsync(stream.fileno())
    stream.close()
    tmp.replace(final)


def _free_bytes(directory: Path) -> int:
    figures = os.statvfs(directory)
    return figures.f_bavail * figures.f_frsize


# ---------------------------------------------------------------- fetching
class ImageFetcher:
    """Fetches blobs of images into ``blobs_dir``, one at a time, counting progress."""

    def __init__(
        self, client: RegistryClient, auth: AuthStore, blobs_dir: Path, progress: Progress | None
    ) -> None:
        self.client, self.auth, self.blobs_dir, self.progress = client, auth, blobs_dir, progress
        self.blobs_done = self.blobs_total = self.bytes_done = self.bytes_total = 0

    async def fetch(
        self, ref: PinnedImageRef, blob: Descriptor | str, *, is_manifest: bool
    ) -> None:
        """Fetch one blob (a bare digest: a manifest of unknown size), unless it is there."""
        digest = blob if isinstance(blob, str) else blob.digest
        final = self.blobs_dir / digest.removeprefix("sha256:")
        if not await asyncio.to_thread(_is_present, final, blob):
            await self._download(ref, digest, blob, final, is_manifest=is_manifest)
        self.blobs_done += 1
        self._report(0)

    async def _download(
        self,
        ref: PinnedImageRef,
        digest: str,
        blob: Descriptor | str,
        final: Path,
        *,
        is_manifest: bool,
    ) -> None:
        max_bytes = MAX_MANIFEST_BYTES if isinstance(blob, str) else blob.size_bytes
        tmp = final.with_name(f".{final.name}.partial.tmp")
        stream = await asyncio.to_thread(tmp.open, "wb")
        try:
            credentials = self.auth.credentials_for(str(ref))
            await self.client.fetch_to(
                str(ref), digest, stream, credentials,
                max_bytes=max_bytes, is_manifest=is_manifest, on_bytes=self._report,
            )  # fmt: skip
            await asyncio.to_thread(_commit, stream, tmp, final)
        finally:
            stream.close()
            tmp.unlink(missing_ok=True)

    def _report(self, count_bytes: int) -> None:
        self.bytes_done += count_bytes
        if self.progress is not None and self.blobs_total:
            self.progress(self.blobs_done, self.blobs_total, self.bytes_done, self.bytes_total)

    async def plan(self, ref: PinnedImageRef, platform: Platform) -> PlannedImage:
        """Fetch ``ref``'s manifest(s) and config; check the config's platform."""
        await self.fetch(ref, ref.digest, is_manifest=True)
        body = await asyncio.to_thread(self._read, ref.digest)
        top = top_descriptor(ref.digest, body, ref)
        manifests = [top]
        child = index_child(body, platform, ref)
        if child is not None:
            await self.fetch(ref, child, is_manifest=True)
            body = await asyncio.to_thread(self._read, child.digest)
            manifests.append(child)
        config, *layers = image_blobs(body, ref)
        if config.media_type in IMAGE_CONFIG_TYPES and config.size_bytes > MAX_CONFIG_BYTES:
            raise ImageNotFound(
                f"{ref}: its image config is {format_bytes(config.size_bytes)}, more than the "
                f"{format_bytes(MAX_CONFIG_BYTES)} a runtime reads"
            )
        await self.fetch(ref, config, is_manifest=False)
        if config.media_type in IMAGE_CONFIG_TYPES:
            _check_platform(await asyncio.to_thread(self._read, config.digest), platform, ref)
        return PlannedImage(ref, tuple(manifests), config, tuple(layers))

    async def fetch_layers(self, images: Sequence[PlannedImage], output_dir: Path) -> None:
        """Every layer not fetched yet, after checking that they fit on the output."""
        fetched = {b.digest: b for i in images for b in (*i.manifests, i.config)}
        todo = {b.digest: (i.ref, b) for i in images for b in i.layers if b.digest not in fetched}
        needed_bytes = sum(b.size_bytes for _, b in todo.values())
        free_bytes = await asyncio.to_thread(_free_bytes, output_dir)
        if needed_bytes > free_bytes:
            raise InsufficientDiskSpace(
                f"{output_dir} has {format_bytes(free_bytes)} free and the layers need up to "
                f"{format_bytes(needed_bytes)}: use a larger medium, or fewer images"
            )
        self.blobs_done, self.blobs_total = len(fetched), len(fetched) + len(todo)
        self.bytes_done = sum(b.size_bytes for b in fetched.values())
        self.bytes_total = self.bytes_done + needed_bytes
        for ref, blob in todo.values():
            await self.fetch(ref, blob, is_manifest=False)

    def _read(self, digest: str) -> bytes:
        return (self.blobs_dir / digest.removeprefix("sha256:")).read_bytes()

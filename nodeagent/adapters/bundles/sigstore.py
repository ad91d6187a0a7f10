"""``bundle create --with-signatures``: each image's sigstore signature, if its registry has one.

For each planned image the registry is asked for the tag ``sha256-<hex>.sig`` of the image's
digest (``bundles.signatures.signature_tag``). When it is there, its manifest (an OCI image
manifest, the only kind the runtime reads there) goes into the bundle's ``blobs/sha256/``
under its own digest, then its config and layers (simple-signing payloads, each at most
``MAX_SIGNATURE_BLOB_BYTES``), fetched and verified like every other blob. No tag: the image
is carried unsigned, as before.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from nodeagent.adapters.bundles.fetcher import Descriptor, ImageFetcher, PlannedImage, image_blobs
from nodeagent.bundles.signatures import (
    MAX_SIGNATURE_MANIFEST_BYTES,
    ImageSignature,
    signature_tag,
)
from nodeagent.errors import ImageNotFound
from nodeagent.registries import MEDIA_TYPE_OCI_MANIFEST, read_manifest
from nodeagent.strict import quoted

MAX_SIGNATURE_BLOB_BYTES = 4 << 20
"""A payload or config of a signature: containers/image reads at most 4 MiB of one."""


@dataclass(frozen=True, slots=True)
class CarriedSignature:
    """A signature the bundle carries, and every blob of it (its manifest first)."""

    signature: ImageSignature
    blobs: tuple[Descriptor, ...]


async def fetch_signature(fetcher: ImageFetcher, image: PlannedImage) -> CarriedSignature | None:
    """``image``'s sigstore signature from its registry into the bundle, or None (no tag)."""
    ref, tag = image.ref, signature_tag(image.ref.digest)
    tmp = fetcher.blobs_dir / f".{tag}.partial.tmp"
    stream = await asyncio.to_thread(tmp.open, "wb")
    try:
        credentials = fetcher.auth.credentials_for(str(ref))
        fetched = await fetcher.client.fetch_tag_to(
            str(ref), tag, stream, credentials, max_bytes=MAX_SIGNATURE_MANIFEST_BYTES
        )
        if fetched is None:
            return None
        final = fetcher.blobs_dir / fetched.digest.removeprefix("sha256:")
        await asyncio.to_thread(_commit, stream, tmp, final)
    finally:
        stream.close()
        tmp.unlink(missing_ok=True)
    body = await asyncio.to_thread(final.read_bytes)
    manifest = read_manifest(body, fetched.media_type, ref=f"{ref.name}:{tag}")
    if manifest.is_index or manifest.media_type != MEDIA_TYPE_OCI_MANIFEST:
        raise ImageNotFound(
            f"{ref.name}:{tag} is a {quoted(manifest.media_type or 'manifest', 80)}, not the "
            "OCI image manifest the runtime reads signatures from"
        )
    blobs = image_blobs(body, ref)
    for blob in blobs:
        if blob.size_bytes > MAX_SIGNATURE_BLOB_BYTES:
            raise ImageNotFound(f"{ref.name}:{tag}: blob {blob.digest} is over 4 MiB")
        await fetcher.fetch(ref, blob, is_manifest=False)
    top = Descriptor(MEDIA_TYPE_OCI_MANIFEST, fetched.digest, fetched.size_bytes)
    return CarriedSignature(ImageSignature(ref, tag, fetched.digest), (top, *blobs))


def _commit(stream: IO[bytes], tmp: Path, final: Path) -> None:
    stream.flush()
    os.fsync(stream.fileno())
    stream.close()
    tmp.replace(final)

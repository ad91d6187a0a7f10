"""A minimal OCI image layout of test images, with an unsigned ``bundle.json``, for import tests.

Not the bundle creator (``nodeagent bundle create`` is): just enough to serve
images from a directory. Blobs are copied, never linked, from the image cache,
so a test may damage its layout without touching the cache.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nodeagent.bundles.manifest import BundleManifest, parse_manifest
from tests.testenv.images import Blob, BuiltImage, BuiltIndex

OCI_LAYOUT_BYTES = b'{"imageLayoutVersion":"1.0.0"}'
REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class OciLayout:
    root: Path
    host: str
    images: tuple[BuiltImage | BuiltIndex, ...]
    manifest: BundleManifest
    """``bundle.json`` as parsed by nodeagent (unsigned: tests skip the signature)."""

    def ref(self, image: BuiltImage | BuiltIndex) -> str:
        return f"{self.host}/{image.repository}@{image.digest}"

    def blob_file(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest.removeprefix("sha256:")


def _all_blobs(image: BuiltImage | BuiltIndex) -> list[Blob]:
    children = image.images if isinstance(image, BuiltIndex) else ()
    return [image.manifest, *(child.manifest for child in children), *image.blobs()]


def _write_blob(blob_dir: Path, blob: Blob) -> None:
    target = blob_dir / blob.digest.removeprefix("sha256:")
    if blob.data is not None:
        target.write_bytes(blob.data)
    elif blob.path is not None:
        shutil.copyfile(blob.path, target)


def _file_entry(root: Path, name: str, data: bytes) -> dict[str, object]:
    (root / name).write_bytes(data)
    return {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "sizeBytes": len(data)}


def write_oci_layout(
    root: Path, host: str, images: Sequence[BuiltImage | BuiltIndex], *, bundle_id: str = "test"
) -> OciLayout:
    """Lay ``images`` out under ``root`` as ``host/<repository>@<digest>``; write bundle.json."""
    blob_dir = root / "blobs" / "sha256"
    blob_dir.mkdir(parents=True)
    blobs = {blob.digest: blob for image in images for blob in _all_blobs(image)}
    for blob in blobs.values():
        _write_blob(blob_dir, blob)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {**image.manifest.descriptor(), "annotations": {REF_NAME: f"{host}/{image.repository}"}}
            for image in images
        ],
    }
    files = [
        _file_entry(root, "oci-layout", OCI_LAYOUT_BYTES),
        _file_entry(root, "index.json", json.dumps(index).encode()),
    ]
    doc = {
        "formatVersion": 1,
        "bundleId": bundle_id,
        "created": "2026-01-01T00:00:00Z",
        "architecture": "amd64",
        "layout": "oci",
        "images": [
            {
                "name": f"{host}/{image.repository}@{image.digest}",
                "manifestDigest": image.digest,
                "sizeBytes": sum(blob.size_bytes for blob in _all_blobs(image)),
            }
            for image in images
        ],
        "blobs": [{"digest": b.digest, "sizeBytes": b.size_bytes} for b in blobs.values()],
        "files": files,
    }
    data = json.dumps(doc, indent=1).encode()
    (root / "bundle.json").write_bytes(data)
    return OciLayout(root, host, tuple(images), parse_manifest(data))

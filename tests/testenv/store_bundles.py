"""Bundles written straight into a node's image store, as a copy or a fetch leaves them.

``store_bundle`` writes real blobs (their digests are their bytes'), a ``bundle.json`` the
bundle parser accepts, a stand-in signature (nothing here checks it: the store is trusted
input to the holdings scan) and, when ``is_recorded``, the record that makes the bundle
count. Without a record the directory looks like a fetch under way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nodeagent.adapters.files import write_atomic
from nodeagent.adapters.store.records import StoreRecords, record_for
from nodeagent.bundles.manifest import parse_manifest
from nodeagent.store import layout

SIGNATURE = b"untrusted comment: test stand-in\nnot checked by the holdings scan\n"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifest_bytes(
    bundle_id: str, blobs: Sequence[bytes], *, note: str = "", node_selector: str | None = None
) -> bytes:
    """A valid ``bundle.json`` listing ``blobs`` (the first is the image's manifest);
    ``note`` changes the manifest (and its digest) without changing its blobs;
    ``node_selector``: a target (format version 2)."""
    digests = [digest_of(b) for b in blobs]
    top = digests[0]
    ref = f"quay.io/acme/app@{top}"
    doc: dict[str, Any] = {
        "formatVersion": 1,
        "bundleId": bundle_id,
        "created": "2026-11-22T09:30:00Z" if not note else f"2026-11-22T09:30:{len(note):02d}Z",
        "architecture": "amd64",
        "layout": "oci",
        "images": [{"name": ref, "manifestDigest": top, "sizeBytes": len(blobs[0])}],
        "blobs": [{"digest": d, "sizeBytes": len(b)} for d, b in zip(digests, blobs, strict=True)],
        "files": [
            {"path": "oci-layout", "sha256": "c" * 64, "sizeBytes": 30},
            {"path": "index.json", "sha256": "c" * 64, "sizeBytes": 40},
        ],
        "pinnedImageSets": [
            {
                "persistent": True,
                "object": {
                    "apiVersion": "machineconfiguration.openshift.io/v1",
                    "kind": "PinnedImageSet",
                    "metadata": {"name": "apps"},
                    "spec": {"pinnedImages": [{"name": ref}]},
                },
            }
        ],
    }
    if node_selector is not None:
        doc |= {"formatVersion": 2, "target": {"nodeSelector": node_selector}}
    return json.dumps(doc, indent=1).encode()


def store_blobs(root: Path, blobs: Sequence[bytes]) -> None:
    for data in blobs:
        write_atomic(root / layout.blob_path(digest_of(data)), data)


def store_bundle(
    root: Path,
    bundle_id: str,
    blobs: Sequence[bytes],
    *,
    is_recorded: bool = True,
    stored: int | None = None,
    note: str = "",
    node_selector: str | None = None,
) -> str:
    """Write the bundle into the store at ``root``; return its manifest digest.
    ``stored``: how many of the blobs are in the store (default all)."""
    data = manifest_bytes(bundle_id, blobs, note=note, node_selector=node_selector)
    store_blobs(root, blobs[: len(blobs) if stored is None else stored])
    records = StoreRecords(root)
    if is_recorded:
        record = record_for(parse_manifest(data), "ABCDEF0123456789", "test", {}, 1.0)
        records.write_bundle(record, data, SIGNATURE)
    else:
        directory = records.bundle_path(bundle_id)
        write_atomic(directory / layout.MANIFEST_NAME, data)
        write_atomic(directory / layout.SIGNATURE_NAME, SIGNATURE)
    return digest_of(data)

"""Store paths, records read strictly, and the OCI index they render."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from nodeagent.errors import StoreRecordDamaged
from nodeagent.store import layout
from nodeagent.store.layout import BlobRef, BundleRecord, StoredImage

DIGEST = "sha256:" + "ab" * 32
RECORD = BundleRecord(
    "line-3",
    "86C9547D3105172D",
    "factory",
    "stable",
    "2026-01-01T00:00:00Z",
    1.5,
    ("s",),
    (StoredImage(f"quay.io/a/b@{DIGEST}", DIGEST, 500, "application/vnd.oci.image.index.v1+json"),),
    (BlobRef(DIGEST, 500),),
)


def test_paths_are_built_from_checked_digests_and_ids_only() -> None:
    assert layout.blob_path(DIGEST) == f"blobs/sha256/{'ab' * 32}"
    assert layout.partial_path(DIGEST) == f"tmp/{'ab' * 32}.partial"
    assert layout.digest_of_name(f"{'ab' * 32}.partial") == DIGEST
    for bad in ("sha256:../../etc", "sha512:" + "a" * 128, "sha256:" + "A" * 64):
        with pytest.raises(ValueError, match="not a sha256 digest"):
            layout.blob_path(bad)
    for bad in ("..", "a/b", "", "x" * 129):
        with pytest.raises(ValueError, match="not a bundle id"):
            layout.bundle_dir(bad)


def test_a_record_round_trips() -> None:
    assert BundleRecord.from_json(json.loads(json.dumps(RECORD.to_json())), "r") == RECORD
    sequenced = dataclasses.replace(RECORD, sequence=(1 << 53) - 1)
    assert BundleRecord.from_json(sequenced.to_json(), "r") == sequenced
    assert "sequence" not in RECORD.to_json()  # as records were written before sequences


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"recordVersion": 2}, "not a version 1 record"),
        ({"bundleId": "../x"}, "bundleId"),
        ({"acceptedAt": float("nan")}, "acceptedAt"),
        ({"acceptedAt": True}, "acceptedAt"),
        ({"keyId": "xyz"}, "keyId"),
        ({"blobs": [{"digest": "sha256:1", "sizeBytes": 1}]}, "not a sha256 digest"),
        ({"blobs": [{"digest": DIGEST, "sizeBytes": -1}]}, "sizeBytes"),
        ({"sets": "s"}, "sets must be a list"),
        ({"sequence": -1}, "sequence"),
        ({"sequence": 1 << 53}, "sequence"),
        ({"sequence": "5"}, "sequence"),
        (
            {"images": [{"name": "x", "digest": DIGEST, "sizeBytes": 1, "mediaType": "bad"}]},
            "mediaType",
        ),
    ],
)
def test_a_record_nodeagent_cannot_have_written_is_damaged(
    change: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(StoreRecordDamaged, match=fragment):
        BundleRecord.from_json(RECORD.to_json() | change, "r")


def test_the_index_names_each_image_once_by_reference() -> None:
    other = StoredImage("a/c@" + DIGEST, DIGEST, 500, "application/vnd.oci.image.manifest.v1+json")
    doc = json.loads(layout.render_index([*RECORD.images, other, *RECORD.images]))
    assert doc["schemaVersion"] == 2
    names = [m["annotations"][layout.REF_NAME_ANNOTATION] for m in doc["manifests"]]
    assert names == sorted({"a/c@" + DIGEST, f"quay.io/a/b@{DIGEST}"})
    assert doc["manifests"][0] == {
        "mediaType": other.media_type,
        "digest": DIGEST,
        "size": 500,
        "annotations": {layout.REF_NAME_ANNOTATION: other.name},
    }


def test_marks_are_read_strictly() -> None:
    assert layout.marks_from_json(layout.marks_to_json({DIGEST: 3.0})) == {DIGEST: 3.0}
    for bad in ({}, {"marks": {"x": 1.0}}, {"marks": {DIGEST: "soon"}}):
        with pytest.raises(StoreRecordDamaged):
            layout.marks_from_json(bad)

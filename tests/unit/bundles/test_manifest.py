"""The bundle manifest and the rules for a bundle's file tree."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodeagent import errors
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles.manifest import TreeEntry

HEX_A, HEX_B, HEX_C = "a" * 64, "b" * 64, "c" * 64
REF = f"quay.io/acme/app@sha256:{HEX_A}"


def manifest_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "formatVersion": 1,
        "bundleId": "line-3.2026-11-22",
        "created": "2026-11-22T09:30:00Z",
        "architecture": "amd64",
        "layout": "oci",
        "images": [{"name": REF, "manifestDigest": f"sha256:{HEX_A}", "sizeBytes": 300}],
        "blobs": [
            {"digest": f"sha256:{HEX_A}", "sizeBytes": 100},
            {"digest": f"sha256:{HEX_B}", "sizeBytes": 200},
        ],
        "files": [
            {"path": "oci-layout", "sha256": HEX_C, "sizeBytes": 30},
            {"path": "index.json", "sha256": HEX_C, "sizeBytes": 40},
        ],
        "pinnedImageSets": [
            {
                "persistent": True,
                "object": {
                    "apiVersion": "machineconfiguration.openshift.io/v1",
                    "kind": "PinnedImageSet",
                    "metadata": {"name": "apps"},
                    "spec": {"pinnedImages": [{"name": REF}]},
                },
            }
        ],
    }
    doc.update(changes)
    return doc


def parse(doc: dict[str, Any]) -> bundle.BundleManifest:
    return bundle.parse_manifest(json.dumps(doc).encode())


def good_tree() -> list[TreeEntry]:
    return [
        TreeEntry("bundle.json", "file", 900),
        TreeEntry("bundle.json.minisig", "file", 300),
        TreeEntry("oci-layout", "file", 30),
        TreeEntry("index.json", "file", 40),
        TreeEntry("blobs", "dir"),
        TreeEntry("blobs/sha256", "dir"),
        TreeEntry(f"blobs/sha256/{HEX_A}", "file", 100),
        TreeEntry(f"blobs/sha256/{HEX_B}", "file", 200),
    ]


def test_parse_good_manifest() -> None:
    m = parse(manifest_doc())
    assert m.bundle_id == "line-3.2026-11-22"
    assert [str(i.ref) for i in m.images] == [REF]
    assert [f.path for f in m.files] == [
        f"blobs/sha256/{HEX_A}",
        f"blobs/sha256/{HEX_B}",
        "index.json",
        "oci-layout",
    ]
    assert m.total_size_bytes == 370
    assert m.sets[0].is_persistent is True
    assert bundle.set_images_missing(m) == []


def test_registry_v2_layout_places_blobs_in_data_files() -> None:
    m = parse(manifest_doc(layout="registry-v2", files=[]))
    assert f"docker/registry/v2/blobs/sha256/aa/{HEX_A}/data" in [f.path for f in m.files]


@pytest.mark.parametrize(
    ("changes", "error", "needle"),
    [
        ({"formatVersion": 2}, bundle.BundleFormatUnsupported, "version 2"),
        ({"formatVersion": None}, bundle.BundleFormatUnsupported, "None"),
        ({"bundleId": "a/b"}, bundle.BundleManifestInvalid, "bundleId"),
        ({"layout": "tar"}, bundle.BundleManifestInvalid, "layout"),
        ({"images": []}, bundle.BundleManifestInvalid, "no images"),
        (
            {"blobs": [{"digest": "sha256:xyz", "sizeBytes": 1}]},
            bundle.BundleManifestInvalid,
            "digest",
        ),
        (
            {"blobs": [{"digest": f"sha256:{HEX_A}", "sizeBytes": -1}]},
            bundle.BundleManifestInvalid,
            "negative",
        ),
        (
            {"blobs": [{"digest": f"sha256:{HEX_A}", "sizeBytes": True}]},
            bundle.BundleManifestInvalid,
            "sizeBytes",
        ),
        (
            {"files": [{"path": "../etc/passwd", "sha256": HEX_C, "sizeBytes": 1}]},
            bundle.BundleUnsafePath,
            "../etc/passwd",
        ),
        (
            {"files": [{"path": "/etc/passwd", "sha256": HEX_C, "sizeBytes": 1}]},
            bundle.BundleUnsafePath,
            "/etc/passwd",
        ),
        (
            {"files": [{"path": "a\\b", "sha256": HEX_C, "sizeBytes": 1}]},
            bundle.BundleUnsafePath,
            "a\\\\b",
        ),
        (
            {"files": [{"path": "bundle.json", "sha256": HEX_C, "sizeBytes": 1}]},
            bundle.BundleManifestInvalid,
            "twice",
        ),
        (
            {"files": [{"path": "x", "sha256": "ABC", "sizeBytes": 1}]},
            bundle.BundleManifestInvalid,
            "hex",
        ),
    ],
)
def test_bad_manifests(changes: dict[str, Any], error: type[Exception], needle: str) -> None:
    with pytest.raises(error) as info:
        parse(manifest_doc(**changes))
    assert needle in str(info.value)


def test_tag_reference_in_images_is_refused() -> None:
    doc = manifest_doc(
        images=[{"name": "quay.io/a/b:1", "manifestDigest": f"sha256:{HEX_A}", "sizeBytes": 1}]
    )
    with pytest.raises(errors.PermanentError) as info:
        parse(doc)
    assert info.value.reason == "ImageReferenceInvalid"


def test_not_json_is_refused() -> None:
    with pytest.raises(bundle.BundleManifestInvalid):
        bundle.parse_manifest(b"\xff not json")


def test_good_tree_passes() -> None:
    bundle.check_tree(good_tree(), parse(manifest_doc()))


def test_empty_lost_and_found_of_ext4_is_tolerated() -> None:
    bundle.check_tree([*good_tree(), TreeEntry("lost+found", "dir")], parse(manifest_doc()))


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (TreeEntry("extra.sh", "file", 10), bundle.BundleUnlistedFile),
        (TreeEntry("blobs/sha256/../x", "file", 10), bundle.BundleUnlistedFile),
        (TreeEntry("blobs/lost+found", "dir"), bundle.BundleUnlistedFile),
        (TreeEntry("lost+found/#1234", "file", 5), bundle.BundleUnlistedFile),
        (TreeEntry("link", "symlink"), bundle.BundleUnsafeEntry),
        (TreeEntry("dev", "other"), bundle.BundleUnsafeEntry),
    ],
)
def test_unsafe_or_unlisted_entries_are_refused(entry: TreeEntry, error: type[Exception]) -> None:
    with pytest.raises(error):
        bundle.check_tree([*good_tree(), entry], parse(manifest_doc()))


def test_wrong_size_and_missing_file_are_refused() -> None:
    m = parse(manifest_doc())
    tree = good_tree()
    tree[-1] = TreeEntry(f"blobs/sha256/{HEX_B}", "file", 199)
    with pytest.raises(bundle.BundleSizeMismatch, match="199 bytes"):
        bundle.check_tree(tree, m)
    with pytest.raises(bundle.BundleIncomplete, match=HEX_B):
        bundle.check_tree(good_tree()[:-1], m)


def test_check_digest() -> None:
    file = bundle.ExpectedFile("blobs/sha256/" + HEX_A, 1, HEX_A)
    bundle.check_digest(file, HEX_A)
    with pytest.raises(bundle.BundleDigestMismatch) as info:
        bundle.check_digest(file, HEX_B)
    assert info.value.reason == "BundleDigestMismatch"


def test_sets_naming_images_the_bundle_lacks() -> None:
    other = f"quay.io/acme/other@sha256:{HEX_B}"
    doc = manifest_doc()
    doc["pinnedImageSets"][0]["object"]["spec"]["pinnedImages"].append({"name": other})
    assert bundle.set_images_missing(parse(doc)) == [other]

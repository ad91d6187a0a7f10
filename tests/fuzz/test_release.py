"""Fuzz: a release image's files (``bundles.release.parse_image_references``,
``parse_release_metadata``) and ``bundle.json``'s ``release`` object (``release_of`` through
``bundles.manifest.parse_manifest``).

Contract: a value, or a ``NodeAgentError`` (``ReleaseImageInvalid``, ``BundleReleaseInvalid``,
…) with a clipped message; a parsed release names only the bundle's images, sets and files.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeagent.bundles import manifest, release
from nodeagent.bundles.manifest import BundleManifest, parse_manifest
from tests.fuzz import strategies as s
from tests.fuzz.contract import outcome, reaching

HEX_A, HEX_C, HEX_D = "a" * 64, "c" * 64, "d" * 64
_REF = f"quay.io/ocp/release@sha256:{HEX_A}"
_SIG = f"release-signatures/sha256-{HEX_A}-1"
_STREAM: dict[str, Any] = {
    "kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
    "spec": {"tags": [{"name": "cli", "from": {"kind": "DockerImage", "name": _REF}}]},
}  # fmt: skip
_STREAM_PATHS: list[tuple[str | int, ...]] = [
    ("kind",), ("spec",), ("spec", "tags"), ("spec", "tags", 0), ("spec", "tags", 0, "name"),
    ("spec", "tags", 0, "from"), ("spec", "tags", 0, "from", "kind"),
    ("spec", "tags", 0, "from", "name"),
]  # fmt: skip
_BUNDLE: dict[str, Any] = {
    "formatVersion": 3, "bundleId": "r", "created": "2026-11-22T09:30:00Z",
    "architecture": "amd64", "layout": "oci",
    "images": [{"name": _REF, "manifestDigest": f"sha256:{HEX_A}", "sizeBytes": 300}],
    "blobs": [{"digest": f"sha256:{HEX_A}", "sizeBytes": 300}],
    "files": [{"path": "oci-layout", "sha256": HEX_C, "sizeBytes": 30},
              {"path": "index.json", "sha256": HEX_C, "sizeBytes": 40},
              {"path": _SIG, "sha256": HEX_D, "sizeBytes": 600}],
    "pinnedImageSets": [{"persistent": True, "object": {
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
        "metadata": {"name": "release-4.16.3"}, "spec": {"pinnedImages": [{"name": _REF}]}}}],
    "release": {"image": _REF, "version": "4.16.3", "set": "release-4.16.3", "signatures": [
        {"digest": f"sha256:{HEX_A}", "index": 1, "path": _SIG, "sizeBytes": 600,
         "sha256": HEX_D}]},
}  # fmt: skip
_BUNDLE_PATHS: list[tuple[str | int, ...]] = [
    ("formatVersion",), ("release",), ("release", "image"), ("release", "version"),
    ("release", "set"), ("release", "signatures"), ("release", "signatures", 0),
    ("release", "signatures", 0, "digest"), ("release", "signatures", 0, "index"),
    ("release", "signatures", 0, "path"), ("release", "signatures", 0, "sizeBytes"),
    ("release", "signatures", 0, "sha256"), ("files", 2, "path"), ("files", 2, "sizeBytes"),
]  # fmt: skip


def _documents(base: dict[str, Any], paths: list[tuple[str | int, ...]]) -> Any:
    return st.one_of(
        st.just(base),
        st.builds(s.replaced, st.just(base), st.sampled_from(paths), s.json_like),
    ).map(lambda doc: json.dumps(doc).encode())


@given(st.one_of(_documents(_STREAM, _STREAM_PATHS), s.raw_bytes))
def test_image_references(data: bytes) -> None:
    outcome("bundles.release.parse_image_references", lambda: release.parse_image_references(data))
    outcome("bundles.release.parse_release_metadata", lambda: release.parse_release_metadata(data))


@given(_documents(_BUNDLE, _BUNDLE_PATHS))
def test_release_object(data: bytes) -> None:
    with reaching("bundles.release.release_of", manifest, "release_of"):
        result = outcome("bundles.manifest.parse_manifest", lambda: parse_manifest(data))
    if isinstance(result, BundleManifest) and result.release is not None:
        files = {f.path: f for f in result.files}
        assert result.release.image in {i.ref for i in result.images}
        assert result.release.set_name in {s.name for s in result.sets}
        for signature in result.release.signatures:
            assert files[signature.path].sha256_hex == signature.sha256_hex
            assert signature.path == release.signature_path(signature.digest, signature.index)

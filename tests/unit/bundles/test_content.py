"""What each image of a bundle needs, and whether the bundle holds it (rules R13, R18-R24).

The bundles here are documents in memory: ``Content`` holds blobs and layout files, makes
the ``bundle.json`` that lists them, and reads them back for ``check_content``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from nodeagent.bundles import content
from nodeagent.bundles import manifest as bundle
from nodeagent.registries import Platform

AMD64 = Platform("linux", "amd64")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def platform(architecture: str) -> dict[str, str]:
    return {"os": "linux", "architecture": architecture}


def desc(data: bytes, media_type: str) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest(data), "size": len(data)}


class Content:
    """Blobs and layout files of a one-image bundle, and the manifest listing them."""

    def __init__(self, *, multi: bool = False, architecture: str = "amd64") -> None:
        self.config = dumps({"os": "linux", "architecture": architecture})
        self.layer = b"layer" * 100
        self.image = dumps(self.image_doc())
        self.blobs = {digest(b): b for b in (self.config, self.layer, self.image)}
        self.top = self.image
        if multi:
            other = dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {}})
            entries = [
                {**desc(self.image, OCI_MANIFEST), "platform": platform("amd64")},
                {**desc(other, OCI_MANIFEST), "platform": platform("arm64")},
            ]
            self.top = dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
            self.blobs[digest(self.top)] = self.top
        self.files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": b""}
        self.index_entries = [desc(self.top, OCI_INDEX if multi else OCI_MANIFEST)]
        self.size_bytes: int | None = None

    def image_doc(self) -> dict[str, Any]:
        return {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": desc(self.config, OCI_CONFIG),
            "layers": [desc(self.layer, LAYER)],
        }

    def set_top(self, data: bytes) -> None:
        """Replace the image manifest (single-image bundles)."""
        del self.blobs[digest(self.top)]
        self.top = self.image = data
        self.blobs[digest(data)] = data
        self.index_entries = [desc(data, OCI_MANIFEST)]

    def manifest(self) -> bundle.BundleManifest:
        self.files["index.json"] = dumps({"schemaVersion": 2, "manifests": self.index_entries})
        ref = f"quay.io/acme/app@{digest(self.top)}"
        size = sum(len(b) for b in self.blobs.values())
        doc = {
            "formatVersion": 1,
            "bundleId": "unit",
            "created": "2026-01-01T00:00:00Z",
            "architecture": "amd64",
            "images": [{"name": ref, "manifestDigest": digest(self.top),
                        "sizeBytes": self.size_bytes or size}],
            "blobs": [{"digest": d, "sizeBytes": len(b)} for d, b in self.blobs.items()],
            "files": [
                {"path": p, "sha256": digest(b).removeprefix("sha256:"), "sizeBytes": len(b)}
                for p, b in self.files.items()
            ],
        }  # fmt: skip
        return bundle.parse_manifest(dumps(doc))

    def read(self, file: bundle.ExpectedFile) -> bytes:
        data = self.files.get(file.path)
        if data is None:
            data = self.blobs["sha256:" + file.sha256_hex]
        assert len(data) == file.size_bytes
        return data

    def check(self, platform: Platform = AMD64) -> None:
        content.check_content(self.manifest(), platform, self.read)


def nest(made: Content) -> None:
    """The index's amd64 entry is an index itself."""
    inner = dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []})
    entry = {**desc(inner, OCI_INDEX), "platform": platform("amd64")}
    del made.blobs[digest(made.top)]
    made.top = dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]})
    made.blobs |= {digest(inner): inner, digest(made.top): made.top}
    made.index_entries = [desc(made.top, OCI_INDEX)]


def refused(change: Callable[[Content], object], **kwargs: Any) -> bundle.BundleError:
    made = Content(**kwargs)
    change(made)
    with pytest.raises(bundle.BundleError) as info:
        made.check()
    return info.value


def test_complete_single_image_and_index_pass() -> None:
    Content().check()
    Content(multi=True).check()


def test_R13_the_bundle_is_for_this_architecture() -> None:
    manifest = Content().manifest()
    content.check_architecture(manifest, AMD64)
    with pytest.raises(bundle.BundleError) as info:
        content.check_architecture(manifest, Platform("linux", "arm64"))
    assert info.value.reason == "BundleArchitectureMismatch"
    assert "--arch arm64" in info.value.message


def test_R18_the_image_manifest_is_in_the_bundle() -> None:
    error = refused(lambda c: c.blobs.pop(digest(c.image)))
    assert (error.reason, "its manifest" in error.message) == ("BundleIncomplete", True)


@pytest.mark.parametrize(
    ("change", "reason", "needle"),
    [
        pytest.param(lambda c: c.blobs.pop(digest(c.image)), "BundleIncomplete",
                     "its linux/amd64 manifest", id="R19-child-missing"),
        pytest.param(nest, "BundleManifestInvalid", "an index, not an image",
                     id="R19-child-is-an-index"),
    ],
)  # fmt: skip
def test_R19_index_child_for_this_platform(
    change: Callable[[Content], object], reason: str, needle: str
) -> None:
    error = refused(change, multi=True)
    assert (error.reason, needle in error.message) == (reason, True), error


def test_R19_an_index_without_this_platform_is_for_another_architecture() -> None:
    made = Content(multi=True)
    with pytest.raises(bundle.BundleError) as info:
        made.check(Platform("linux", "s390x"))
    assert info.value.reason == "BundleArchitectureMismatch"
    assert "linux/amd64, linux/arm64" in info.value.message


@pytest.mark.parametrize(
    ("change", "reason", "needle"),
    [
        pytest.param(lambda c: c.blobs.pop(digest(c.layer)), "BundleIncomplete", "its layer",
                     id="R20-layer-missing"),
        pytest.param(lambda c: c.blobs.pop(digest(c.config)), "BundleIncomplete", "its config",
                     id="R20-config-missing"),
        pytest.param(lambda c: c.set_top(dumps(c.image_doc() | {"layers": [
                         {**desc(c.layer, LAYER), "size": len(c.layer) + 1}]})),
                     "BundleSizeMismatch", "declares", id="R20-declared-size"),
    ],
)  # fmt: skip
def test_R20_config_and_layers_are_listed_with_their_sizes(
    change: Callable[[Content], object], reason: str, needle: str
) -> None:
    error = refused(change)
    assert (error.reason, needle in error.message) == (reason, True), error


def test_R21_an_image_config_of_another_architecture_is_refused() -> None:
    error = refused(lambda c: None, architecture="arm64")
    assert (error.reason, "linux/arm64 image" in error.message) == (
        "BundleArchitectureMismatch",
        True,
    )


def test_R21_configs_of_other_media_types_are_not_read() -> None:
    made = Content(architecture="arm64")
    doc = made.image_doc()
    doc["config"]["mediaType"] = "application/vnd.acme.thing.v1+json"
    made.set_top(dumps(doc))
    made.check()


def test_R22_the_image_size_is_the_sum_of_its_blobs() -> None:
    def understate(c: Content) -> None:
        c.size_bytes = sum(len(b) for b in c.blobs.values()) - 1

    error = refused(understate)
    assert (error.reason, "add up to" in error.message) == ("BundleSizeMismatch", True)


def v2(**fields: Any) -> bytes:
    """A manifest body of schema version 2 with ``fields``."""
    return dumps({"schemaVersion": 2, **fields})


A64 = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        pytest.param(b"\xff\xfe{}", "not UTF-8", id="R23-utf16"),
        pytest.param(b"[" * 40 + b"]" * 40, "nested 40 deep", id="R23-depth"),
        pytest.param(b'{"schemaVersion": 2, "a": 1, "a": 2}', "duplicate key", id="R23-dup"),
        pytest.param(b"[]", "not a JSON object", id="R23-not-an-object"),
        pytest.param(dumps({"schemaVersion": 1, "config": {}, "layers": []}),
                     "schemaVersion must be 2", id="R23-schema-version"),
        pytest.param(dumps({"schemaVersion": True, "config": {}, "layers": []}),
                     "schemaVersion must be 2", id="R23-schema-version-true"),
        pytest.param(v2(mediaType="application/vnd.docker.distribution.manifest.v1+json"),
                     "neither an image manifest nor an index", id="R23-media-type"),
        pytest.param(v2(mediaType=7), "mediaType must be a string", id="R23-media-type-kind"),
        pytest.param(v2(config={"digest": "../x", "size": 1}, layers=[]), "is not sha256",
                     id="R23-descriptor-digest"),
        pytest.param(v2(config={"digest": A64, "size": True}, layers=[]), "size must be",
                     id="R23-descriptor-size"),
        pytest.param(v2(config={}, layers={}), "layers must be a list", id="R23-layers-list"),
        pytest.param(v2(manifests=[{"digest": A64, "size": 1, "platform": "linux"}]),
                     "platform must be an object", id="R23-platform"),
    ],
)  # fmt: skip
def test_R23_manifests_are_strict_and_of_known_kinds(body: bytes, needle: str) -> None:
    error = refused(lambda c: c.set_top(body))
    assert (error.reason, needle in error.message) == ("BundleManifestInvalid", True), error


def test_R23_documents_of_too_many_values_are_not_parsed() -> None:
    error = refused(lambda c: c.set_top(b"[" + b"[]," * content.MAX_DOCUMENT_VALUES + b"[]]"))
    assert (error.reason, "values" in error.message) == ("BundleManifestInvalid", True)


def test_R23_documents_over_4_MiB_are_not_read() -> None:
    error = refused(lambda c: c.set_top(b" " * (content.MAX_DOCUMENT_BYTES + 1)))
    assert (error.reason, "at most" in error.message) == ("BundleManifestInvalid", True)


@pytest.mark.parametrize(
    ("change", "reason", "needle"),
    [
        pytest.param(lambda c: c.files.pop("oci-layout"), "BundleIncomplete", "oci-layout",
                     id="R24-oci-layout-listed"),
        pytest.param(lambda c: c.files.update({"oci-layout": b'{"imageLayoutVersion": "2"}'}),
                     "BundleManifestInvalid", "imageLayoutVersion", id="R24-oci-layout-version"),
        pytest.param(lambda c: c.index_entries.append(desc(b"elsewhere", OCI_MANIFEST)),
                     "BundleIncomplete", "index.json", id="R24-index-names-unlisted-blob"),
        pytest.param(lambda c: c.index_entries.append({**desc(c.layer, LAYER), "size": 1}),
                     "BundleSizeMismatch", "index.json", id="R24-index-size"),
        pytest.param(lambda c: c.index_entries.clear(), "BundleManifestInvalid",
                     "does not name", id="R24-index-names-every-image"),
    ],
)  # fmt: skip
def test_R24_oci_layout_files(
    change: Callable[[Content], object], reason: str, needle: str
) -> None:
    error = refused(change)
    assert (error.reason, needle in error.message) == (reason, True), error

"""What each image of a bundle needs, and whether the bundle holds all of it (pure).

For every image of ``bundle.json``:

- the manifest its digest names is a listed blob;
- for an index, the child the runtime picks for this node's platform (the choice
  ``bundle create`` made: ``registries.select_platform``) is a listed blob, and an image
  manifest; an index without a child for the platform is for another architecture;
- the image manifest's config and every layer are listed blobs, each listed with the
  size the manifest declares;
- an image config (a known config media type) names this node's os and architecture;
- the image's ``sizeBytes`` is the sum of the sizes of those blobs (disk admission uses it).

For the OCI layout, ``oci-layout`` and ``index.json`` are listed and well-formed, and
``index.json`` names listed blobs only, with their sizes, and every image.

Blob bytes come from the caller's ``read(file)``, which returns exactly the listed bytes
checked against their digest (``nodeagent.adapters.bundles.tree``); only manifests,
configs and layout files are read, each at most ``MAX_DOCUMENT_BYTES``, and parsed with
``strict.loads_json``. Rules and reason codes: docs/bundle-format.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.bundles.manifest import (
    BundleImage,
    BundleIncomplete,
    BundleManifest,
    BundleManifestInvalid,
    BundleSizeMismatch,
    ExpectedFile,
    count_values,
)
from nodeagent.bundles.signatures import ImageSignature
from nodeagent.errors import BundleArchitectureMismatch, ImageNotFound
from nodeagent.registries import (
    IMAGE_MEDIA_TYPES,
    INDEX_MEDIA_TYPES,
    MEDIA_TYPE_OCI_MANIFEST,
    ManifestIndex,
    Platform,
    select_platform,
)
from nodeagent.strict import MalformedInput, clip, loads_json, quoted

MAX_DOCUMENT_BYTES: Final = 4 << 20
"""Manifests (distribution's own limit), image configs, ``index.json`` and ``oci-layout``."""
MAX_DOCUMENT_DEPTH: Final = 32
MAX_DOCUMENT_VALUES: Final = 100_000
"""Objects, arrays and commas in one document (``manifest.count_values``): an image of 200
layers has about 1,500; 4 MiB of ``[],`` would be 1.4 million (130 MiB parsed)."""
OCI_LAYOUT_VERSION: Final = "1.0.0"
SCHEMA_VERSION: Final = 2
"""Of every OCI and Docker schema 2 manifest and index, and of ``index.json``."""
IMAGE_CONFIG_TYPES: Final = frozenset(
    {"application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"}
)
_DIGEST: Final = re.compile(r"^sha256:[a-f0-9]{64}$")

ReadFile = Callable[[ExpectedFile], bytes]
"""The listed bytes of a file of the bundle, checked against its digest."""


@dataclass(frozen=True, slots=True)
class Descriptor:
    media_type: str
    digest: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """An image manifest (``config`` set) or an index (``children`` set)."""

    config: Descriptor | None = None
    layers: tuple[Descriptor, ...] = ()
    children: tuple[tuple[Descriptor, Platform], ...] = ()


# ---------------------------------------------------------------- documents
def read_document(file: ExpectedFile, read: ReadFile, what: str) -> dict[str, Any]:
    """A small JSON file of the bundle, strictly parsed, as an object."""
    if file.size_bytes > MAX_DOCUMENT_BYTES:
        raise BundleManifestInvalid(
            f"{what} is {file.size_bytes} bytes; at most {MAX_DOCUMENT_BYTES} are read"
        )
    data = read(file)
    if count_values(data) > MAX_DOCUMENT_VALUES:
        raise BundleManifestInvalid(f"{what} holds more than {MAX_DOCUMENT_VALUES} values")
    try:
        doc = loads_json(
            data, what=what, max_bytes=MAX_DOCUMENT_BYTES, max_depth=MAX_DOCUMENT_DEPTH
        )
    except MalformedInput as exc:
        raise BundleManifestInvalid(str(exc)) from None
    if not isinstance(doc, dict):
        raise BundleManifestInvalid(f"{what} is not a JSON object")
    return doc


def descriptor(item: object, what: str) -> Descriptor:
    """An OCI descriptor: a sha256 digest, a size, and a media type if it has one."""
    if not isinstance(item, dict):
        raise BundleManifestInvalid(f"{what}: a descriptor must be an object")
    digest, size, media_type = item.get("digest"), item.get("size"), item.get("mediaType", "")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise BundleManifestInvalid(f"{what}: digest {quoted(digest, 100)} is not sha256:<64 hex>")
    if type(size) is not int or size < 0:
        raise BundleManifestInvalid(f"{what}: size must be a non-negative integer")
    if not isinstance(media_type, str):
        raise BundleManifestInvalid(f"{what}: mediaType must be a string")
    return Descriptor(media_type, digest, size)


def _list(doc: Mapping[str, Any], key: str, what: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise BundleManifestInvalid(f"{what}: {key} must be a list")
    return value


def _check_schema_version(doc: Mapping[str, Any], what: str) -> None:
    version = doc.get("schemaVersion")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise BundleManifestInvalid(f"{what}: schemaVersion must be {SCHEMA_VERSION}")


def _platform(item: Mapping[str, Any], what: str) -> Platform:
    found = item.get("platform", {})
    if not isinstance(found, dict):
        raise BundleManifestInvalid(f"{what}: platform must be an object")
    parts = [found.get(key, "") for key in ("os", "architecture", "variant")]
    if not all(isinstance(part, str) for part in parts):
        raise BundleManifestInvalid(f"{what}: platform os, architecture, variant are strings")
    return Platform(*parts)


def parse_content_manifest(doc: Mapping[str, Any], what: str) -> Manifest:
    """An image manifest or an index, known by its media type or (OCI) its shape."""
    _check_schema_version(doc, what)
    media_type = doc.get("mediaType")
    if media_type is not None and not isinstance(media_type, str):
        raise BundleManifestInvalid(f"{what}: mediaType must be a string")
    if media_type in INDEX_MEDIA_TYPES or (media_type is None and "manifests" in doc):
        items = _list(doc, "manifests", what)
        children = tuple(
            (descriptor(item, f"{what} manifests[{n}]"), _platform(item, f"{what} manifests[{n}]"))
            for n, item in enumerate(items)
        )
        return Manifest(children=children)
    if media_type in IMAGE_MEDIA_TYPES or (media_type is None and "config" in doc):
        layers = _list(doc, "layers", what)
        return Manifest(
            config=descriptor(doc.get("config"), f"{what} config"),
            layers=tuple(descriptor(item, f"{what} layers[{n}]") for n, item in enumerate(layers)),
        )
    raise BundleManifestInvalid(
        f"{what} is neither an image manifest nor an index (media type {quoted(media_type, 100)})"
    )


# ---------------------------------------------------------------- checks
def check_architecture(manifest: BundleManifest, platform: Platform) -> None:
    """The bundle is made for this node's architecture."""
    if manifest.architecture != platform.architecture:
        raise BundleArchitectureMismatch(
            f"bundle {manifest.bundle_id} is for {manifest.architecture} and this node is "
            f"{platform}: use a bundle made with --arch {platform.architecture}"
        )


def check_content(manifest: BundleManifest, platform: Platform, read: ReadFile) -> None:
    """Every image of the bundle complete for ``platform``; then the OCI layout's own files."""
    for image in manifest.images:
        _check_image(manifest, image, platform, read)
    for signature in manifest.image_signatures:
        _check_signature(manifest, signature, read)
    if manifest.layout == "oci":
        _check_oci_layout(manifest, read)


def _listed(manifest: BundleManifest, digest: str, what: str) -> ExpectedFile:
    file = manifest.blobs.get(digest)
    if file is None:
        raise BundleIncomplete(f"{what} {digest} is not in the bundle (bundle.json blobs)")
    return file


def _same_size(found: Descriptor, file: ExpectedFile, what: str) -> None:
    if found.size_bytes != file.size_bytes:
        raise BundleSizeMismatch(
            f"{what} declares {found.digest} as {found.size_bytes} bytes, bundle.json lists "
            f"{file.size_bytes}"
        )


def _check_oci_layout(manifest: BundleManifest, read: ReadFile) -> None:
    files = {f.path: f for f in manifest.files}
    for name in ("oci-layout", "index.json"):
        if name not in files:
            raise BundleIncomplete(f"an OCI layout bundle lists {name} in files[]; this one not")
    layout = read_document(files["oci-layout"], read, "oci-layout")
    if layout.get("imageLayoutVersion") != OCI_LAYOUT_VERSION:
        raise BundleManifestInvalid(f"oci-layout: imageLayoutVersion must be {OCI_LAYOUT_VERSION}")
    index = read_document(files["index.json"], read, "index.json")
    _check_schema_version(index, "index.json")
    named = set()
    for n, item in enumerate(_list(index, "manifests", "index.json")):
        found = descriptor(item, f"index.json manifests[{n}]")
        _same_size(found, _listed(manifest, found.digest, "index.json: its entry"), "index.json")
        named.add(found.digest)
    for image in manifest.images:
        if image.manifest_digest not in named:
            raise BundleManifestInvalid(f"index.json does not name {image.ref}")


def _check_image(
    manifest: BundleManifest, image: BundleImage, platform: Platform, read: ReadFile
) -> None:
    ref = str(image.ref)
    file = _listed(manifest, image.manifest_digest, f"{ref}: its manifest")
    top = parse_content_manifest(read_document(file, read, f"manifest of {ref}"), ref)
    used = {image.manifest_digest: file.size_bytes}
    if top.config is None:
        child = _child(top, platform, ref)
        file = _listed(manifest, child.digest, f"{ref}: its {platform} manifest")
        _same_size(child, file, f"the index of {ref}")
        top = parse_content_manifest(read_document(file, read, f"manifest of {ref}"), ref)
        if top.config is None:
            raise BundleManifestInvalid(f"{ref}: its {platform} entry is an index, not an image")
        used[child.digest] = file.size_bytes
    for blob, role in [(top.config, "config"), *((layer, "layer") for layer in top.layers)]:
        found = _listed(manifest, blob.digest, f"{ref}: its {role}")
        _same_size(blob, found, f"the manifest of {ref}")
        used[blob.digest] = found.size_bytes
    _check_config(manifest, top.config, platform, read, ref)
    total_bytes = sum(used.values())
    if total_bytes != image.size_bytes:
        raise BundleSizeMismatch(
            f"bundle.json says {ref} is {image.size_bytes} bytes; its manifest, config and "
            f"layers add up to {total_bytes}"
        )


def _check_signature(manifest: BundleManifest, signature: ImageSignature, read: ReadFile) -> None:
    """A carried signature is what the runtime reads: an OCI image manifest whose config and
    layers (the payloads) are listed blobs of the sizes it declares (rule R38)."""
    what = f"{signature.image}: its signature {signature.tag}"
    doc = read_document(_listed(manifest, signature.manifest_digest, what), read, what)
    found = parse_content_manifest(doc, what)
    if found.config is None or doc.get("mediaType") != MEDIA_TYPE_OCI_MANIFEST:
        raise BundleManifestInvalid(f"{what} is not an OCI image manifest (mediaType)")
    for blob in (found.config, *found.layers):
        _same_size(blob, _listed(manifest, blob.digest, what), what)


def _child(index: Manifest, platform: Platform, ref: str) -> Descriptor:
    entries = ManifestIndex(tuple((d.digest, found) for d, found in index.children))
    try:
        digest = select_platform(entries, platform, ref=ref)
    except ImageNotFound as exc:
        raise BundleArchitectureMismatch(clip(exc.message, 400)) from None
    return next(d for d, _ in index.children if d.digest == digest)


def _check_config(
    manifest: BundleManifest, config: Descriptor, platform: Platform, read: ReadFile, ref: str
) -> None:
    if config.media_type not in IMAGE_CONFIG_TYPES:
        return  # not an image config: nothing says a platform (bundle create skips it too)
    doc = read_document(manifest.blobs[config.digest], read, f"image config of {ref}")
    found = (doc.get("os"), doc.get("architecture"))
    if found != (platform.os, platform.architecture):
        shown = "/".join(clip(part, 40) for part in found)
        raise BundleArchitectureMismatch(f"{ref} is a {shown} image; this node is {platform}")

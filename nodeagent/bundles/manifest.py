"""Upgrade bundles: the signed manifest and the rules a bundle's file tree must follow.

Pure functions over the manifest bytes and a description of the tree; the
adapter that walks the mounted medium and hashes its files lives in
``nodeagent/adapters``. The format is documented in docs/bundle-format.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from nodeagent.errors import (  # re-exported: callers may name them bundle.X
    BundleDigestMismatch as BundleDigestMismatch,
)
from nodeagent.errors import (
    BundleError as BundleError,
)
from nodeagent.errors import (
    BundleFormatUnsupported as BundleFormatUnsupported,
)
from nodeagent.errors import (
    BundleIncomplete as BundleIncomplete,
)
from nodeagent.errors import (
    BundleManifestInvalid as BundleManifestInvalid,
)
from nodeagent.errors import (
    BundleSizeMismatch as BundleSizeMismatch,
)
from nodeagent.errors import (
    BundleUnlistedFile as BundleUnlistedFile,
)
from nodeagent.errors import (
    BundleUnsafeEntry as BundleUnsafeEntry,
)
from nodeagent.errors import (
    BundleUnsafePath as BundleUnsafePath,
)
from nodeagent.references import PinnedImageRef, parse_pinned_image_ref

FORMAT_VERSION = 1
MANIFEST_NAME = "bundle.json"
SIGNATURE_NAME = "bundle.json.minisig"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
"""Read at most this much of ``bundle.json`` before its signature is checked."""

TOLERATED_DIRS = frozenset({"lost+found"})
"""Directories a filesystem makes by itself (mkfs.ext4); they must be empty: any file in them
is unlisted and refused."""

_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_HEX = re.compile(r"^[a-f0-9]{64}$")
_BUNDLE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


@dataclass(frozen=True, slots=True)
class BundleImage:
    ref: PinnedImageRef
    manifest_digest: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ExpectedFile:
    """A file the bundle must hold: its path (relative, ``/``-separated), size and digest."""

    path: str
    size_bytes: int
    sha256_hex: str


@dataclass(frozen=True, slots=True)
class BundleSet:
    is_persistent: bool
    object: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class BundleManifest:
    bundle_id: str
    created: str
    architecture: str
    layout: Literal["oci", "registry-v2"]
    images: tuple[BundleImage, ...]
    files: tuple[ExpectedFile, ...]
    """Every file besides the manifest and its signature: blobs and layout files."""
    sets: tuple[BundleSet, ...]

    @property
    def total_size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


# ---------------------------------------------------------------- paths
def check_relative_path(path: str) -> str:
    """Accept a plain relative ``/``-separated path; refuse anything that could escape."""
    parts = path.split("/")
    is_bad = (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or any(part in ("", ".", "..") for part in parts)
    )
    if is_bad:
        raise BundleUnsafePath(f"bundle manifest names an unsafe path {path!r}")
    return path


def blob_path(layout: str, digest: str) -> str:
    """Where a blob lives in the bundle for ``layout``."""
    hex_part = digest.removeprefix("sha256:")
    if layout == "oci":
        return f"blobs/sha256/{hex_part}"
    return f"docker/registry/v2/blobs/sha256/{hex_part[:2]}/{hex_part}/data"


# ---------------------------------------------------------------- manifest
def _need(doc: Mapping[str, Any], key: str, kind: type, where: str = "bundle.json") -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BundleManifestInvalid(f"{where}: {key} must be a {kind.__name__}")
    return value


def _size(doc: Mapping[str, Any], where: str) -> int:
    size: int = _need(doc, "sizeBytes", int, where)
    if size < 0:
        raise BundleManifestInvalid(f"{where}: sizeBytes must not be negative")
    return size


def _digest(text: object, where: str) -> str:
    if not isinstance(text, str) or not _DIGEST.match(text):
        raise BundleManifestInvalid(f"{where}: {text!r} is not a sha256:<64 hex> digest")
    return text


def _images(doc: Mapping[str, Any]) -> tuple[BundleImage, ...]:
    images = []
    for index, item in enumerate(_need(doc, "images", list)):
        where = f"bundle.json images[{index}]"
        if not isinstance(item, dict):
            raise BundleManifestInvalid(f"{where} must be an object")
        ref = parse_pinned_image_ref(_need(item, "name", str, where))
        digest = _digest(item.get("manifestDigest"), where)
        images.append(BundleImage(ref, digest, _size(item, where)))
    if not images:
        raise BundleManifestInvalid("bundle.json lists no images")
    return tuple(images)


def _files(doc: Mapping[str, Any], layout: str) -> tuple[ExpectedFile, ...]:
    files: dict[str, ExpectedFile] = {}
    for index, item in enumerate(_need(doc, "blobs", list)):
        where = f"bundle.json blobs[{index}]"
        digest = _digest(item.get("digest") if isinstance(item, dict) else None, where)
        path = blob_path(layout, digest)
        files[path] = ExpectedFile(path, _size(item, where), digest.removeprefix("sha256:"))
    for index, item in enumerate(_need(doc, "files", list)):
        where = f"bundle.json files[{index}]"
        if not isinstance(item, dict):
            raise BundleManifestInvalid(f"{where} must be an object")
        path = check_relative_path(_need(item, "path", str, where))
        hex_part = _need(item, "sha256", str, where)
        if not _HEX.match(hex_part):
            raise BundleManifestInvalid(f"{where}: sha256 must be 64 lowercase hex digits")
        if path in (MANIFEST_NAME, SIGNATURE_NAME) or path in files:
            raise BundleManifestInvalid(f"{where}: {path} is listed twice")
        files[path] = ExpectedFile(path, _size(item, where), hex_part)
    return tuple(sorted(files.values(), key=lambda f: f.path))


def _sets(doc: Mapping[str, Any]) -> tuple[BundleSet, ...]:
    sets = []
    for index, item in enumerate(doc.get("pinnedImageSets", [])):
        where = f"bundle.json pinnedImageSets[{index}]"
        if not isinstance(item, dict):
            raise BundleManifestInvalid(f"{where} must be an object")
        sets.append(
            BundleSet(_need(item, "persistent", bool, where), _need(item, "object", dict, where))
        )
    return tuple(sets)


def parse_manifest(data: bytes) -> BundleManifest:
    """Parse ``bundle.json`` — only ever called after its signature was verified."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleManifestInvalid(f"bundle.json is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise BundleManifestInvalid("bundle.json must hold a JSON object")
    version = doc.get("formatVersion")
    if version != FORMAT_VERSION:
        raise BundleFormatUnsupported(
            f"bundle format version {version!r} is not supported (this nodeagent reads "
            f"version {FORMAT_VERSION}); use a bundle made for this nodeagent version"
        )
    bundle_id = _need(doc, "bundleId", str)
    if not _BUNDLE_ID.match(bundle_id):
        raise BundleManifestInvalid(f"bundleId {bundle_id!r} must be 1-128 of A-Z a-z 0-9 . _ -")
    layout = doc.get("layout", "oci")
    if layout not in ("oci", "registry-v2"):
        raise BundleManifestInvalid(f"layout {layout!r} must be 'oci' or 'registry-v2'")
    return BundleManifest(
        bundle_id=bundle_id,
        created=str(doc.get("created", "")),
        architecture=_need(doc, "architecture", str),
        layout=layout,
        images=_images(doc),
        files=_files(doc, layout),
        sets=_sets(doc),
    )


# ---------------------------------------------------------------- the tree
EntryKind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One entry of the medium as ``lstat`` saw it (links not followed)."""

    path: str
    kind: EntryKind
    size_bytes: int = 0


def check_tree(entries: Iterable[TreeEntry], manifest: BundleManifest) -> None:
    """Refuse a tree with unsafe, unlisted, missing or wrongly sized entries (no hashing)."""
    expected = {f.path: f for f in manifest.files}
    allowed = set(expected) | {MANIFEST_NAME, SIGNATURE_NAME}
    parents = {"/".join(p.split("/")[:i]) for p in allowed for i in range(1, p.count("/") + 1)}
    seen: set[str] = set()
    for entry in sorted(entries, key=lambda e: e.path):
        _check_entry(entry, expected, allowed, parents)
        seen.add(entry.path)
    missing = sorted(set(expected) - seen)
    if missing:
        raise BundleIncomplete(
            f"{len(missing)} listed file(s) missing from the bundle, first {missing[0]}; "
            "the medium may be incomplete or was written partly"
        )


def _check_entry(
    entry: TreeEntry,
    expected: Mapping[str, ExpectedFile],
    allowed: set[str],
    parents: set[str],
) -> None:
    if entry.kind in ("symlink", "other"):
        raise BundleUnsafeEntry(
            f"{entry.path} is a {'symbolic link' if entry.kind == 'symlink' else 'special file'}; "
            "bundles hold only regular files and directories"
        )
    if entry.kind == "dir":
        if entry.path not in parents and entry.path not in TOLERATED_DIRS:
            raise BundleUnlistedFile(f"directory {entry.path} is not part of the bundle")
        return
    if entry.path not in allowed:
        raise BundleUnlistedFile(f"{entry.path} is not listed in bundle.json")
    want = expected.get(entry.path)
    if want is not None and want.size_bytes != entry.size_bytes:
        raise BundleSizeMismatch(
            f"{entry.path} is {entry.size_bytes} bytes, bundle.json says {want.size_bytes}"
        )


def check_digest(file: ExpectedFile, actual_hex: str) -> None:
    if actual_hex != file.sha256_hex:
        raise BundleDigestMismatch(
            f"{file.path} does not match its digest (sha256 {actual_hex[:12]}…, "
            f"expected {file.sha256_hex[:12]}…): the bundle is damaged or was altered"
        )


def set_images_missing(manifest: BundleManifest) -> Sequence[str]:
    """Images the bundle's PinnedImageSets name that the bundle does not carry."""
    carried = {str(image.ref) for image in manifest.images}
    named = [
        str(item.get("name", ""))
        for s in manifest.sets
        for item in s.object.get("spec", {}).get("pinnedImages", [])
        if isinstance(item, dict)
    ]
    return sorted(set(named) - carried)

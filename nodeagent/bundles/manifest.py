"""Upgrade bundles: the signed manifest, its paths and its parsing.

Pure functions over the manifest bytes; the rules a bundle's file tree must follow are
``nodeagent.bundles.tree_rules``, the adapter that walks the mounted medium and hashes its
files lives in ``nodeagent/adapters``. What the images in the bundle need (completeness) is
``nodeagent.bundles.content``. The format and every rule, with its reason code, is
docs/bundle-format.md. Every text taken from a bundle that reaches a message is
clipped (``strict.clip``): a 10 MB string in ``bundle.json`` stays out of the journal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from nodeagent.bundles.agent_image import AgentImage, agent_image_of
from nodeagent.bundles.freshness import DEFAULT_CHANNEL as DEFAULT_CHANNEL
from nodeagent.bundles.freshness import TIME_FORM, Stamp, freshness_of, with_links
from nodeagent.bundles.release import BundleRelease, release_of
from nodeagent.bundles.signatures import ImageSignature, image_signatures_of
from nodeagent.bundles.tags import ServedTag, served_tags_of
from nodeagent.bundles.target import FORMAT_VERSION as FORMAT_VERSION
from nodeagent.bundles.target import FRESHNESS_FORMAT_VERSION as FRESHNESS_FORMAT_VERSION
from nodeagent.bundles.target import TARGET_FORMAT_VERSION as TARGET_FORMAT_VERSION
from nodeagent.bundles.target import BundleTarget, target_of
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
    BundleSetInvalid as BundleSetInvalid,
)
from nodeagent.errors import (
    BundleSizeMismatch as BundleSizeMismatch,
)
from nodeagent.errors import BundleUnlistedFile as BundleUnlistedFile
from nodeagent.errors import BundleUnsafeEntry as BundleUnsafeEntry
from nodeagent.errors import BundleUnsafePath as BundleUnsafePath
from nodeagent.errors import ImageReferenceInvalid, SpecInvalid
from nodeagent.references import PinnedImageRef, parse_pinned_image_ref
from nodeagent.specs import API_VERSION, KIND, PinnedImageSet, parse_set_object
from nodeagent.strict import MalformedInput, clip, loads_json, quoted

FORMAT_VERSIONS: Final = (FORMAT_VERSION, TARGET_FORMAT_VERSION, FRESHNESS_FORMAT_VERSION)
_VERSIONS: Final = f"{', '.join(map(str, FORMAT_VERSIONS[:-1]))} or {FORMAT_VERSIONS[-1]}"
MANIFEST_NAME: Final = "bundle.json"
SIGNATURE_NAME: Final = "bundle.json.minisig"
ECDSA_SIGNATURE_NAME: Final = "bundle.json.ecdsa-sig"
"""The FIPS-approved signature of ``bundle.json`` (``bundles.ecdsa_signature``), beside or
instead of the minisign one."""
MAX_MANIFEST_BYTES: Final = 16 * 1024 * 1024
"""Read at most this much of ``bundle.json`` before its signature is checked."""
MAX_MANIFEST_DEPTH: Final = 16
"""``bundle.json`` is nested 6 deep (pinnedImageSets[].object.spec.pinnedImages[].name)."""
MAX_MANIFEST_VALUES: Final = 250_000
"""Objects, arrays and commas in ``bundle.json``, counted before it is parsed: a bundle of
1,000 images and 5,000 blobs has about 25,000; 16 MiB of ``[],`` would be 5.6 million
values and take 500 MiB to parse, 250,000 at most 45 MiB (both measured)."""
MAX_SIZE_BYTES: Final = (1 << 63) - 1
"""The largest file size a filesystem can report (off_t)."""
MAX_PATH_CHARS: Final = 1024
MAX_NAME_BYTES: Final = 255
"""NAME_MAX of Linux filesystems: one path component, or a file name nodeagent writes."""

_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_HEX = re.compile(r"^[a-f0-9]{64}$")
_BUNDLE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_ARCHITECTURE = re.compile(r"^[a-z0-9_]{1,32}$")
_LAYOUTS: Final = ("oci", "registry-v2")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


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
    """A PinnedImageSet the bundle carries, checked as the node checks spec files."""

    is_persistent: bool
    image_set: PinnedImageSet = field(compare=False)

    @property
    def name(self) -> str:
        return self.image_set.name

    @property
    def object(self) -> dict[str, Any]:
        """The set in the OpenShift shape: exactly what was checked, nothing else."""
        return set_object(self.image_set)


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
    blobs: Mapping[str, ExpectedFile] = field(default_factory=dict)
    """Digest → file of every blob ``blobs[]`` lists: all the content the bundle serves."""
    channel: str = DEFAULT_CHANNEL
    """The optional ``channel``: a release line of the signing key (``bundles.freshness``)."""
    sequence: int = 0
    expires: str | None = None
    """Its place in its channel and its optional expiry: anti-rollback, ``bundles.freshness``."""
    format_version: int = FRESHNESS_FORMAT_VERSION
    """``formatVersion`` (1, 2 or 3): a key's older formats are refused after a newer one."""
    supersedes: tuple[str, ...] = ()
    """Key ids the signing key replaces (format 3, ``bundles.freshness``)."""
    target: BundleTarget | None = None
    """The optional ``target`` (format version 2): the nodes the bundle is meant for, beyond
    its ``architecture`` (``bundles.target``)."""
    release: BundleRelease | None = None  # format version 3: an OpenShift release (bundles.release)
    image_signatures: tuple[ImageSignature, ...] = ()  # format 3: bundles.signatures
    served_tags: tuple[ServedTag, ...] = ()
    """Format 3, ``bundle create --serve-tags``: tags the node's mirrors answer with exactly
    their signed digest, frozen while served (``bundles.tags``)."""
    agent_image: AgentImage | None = None
    """Format 3, ``agentImage``: nodeagent's own image and its signed statement, the
    container variant's self-update (``bundles.agent_image``)."""

    @property
    def total_size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    def stamp(self, key_id_hex: str, manifest_digest: str, linked: tuple[str, ...] = ()) -> Stamp:
        """What the anti-rollback rule sees of this manifest, signed by ``key_id_hex`` (and
        ``linked``, the other key when both schemes signed it: ``freshness.with_links``)."""
        return Stamp(
            key_id_hex,
            self.channel,
            self.sequence,
            manifest_digest,
            self.bundle_id,
            format_version=self.format_version,
            supersedes=with_links(self.supersedes, key_id_hex, linked),
        )


def set_object(image_set: PinnedImageSet) -> dict[str, Any]:
    """A valid set in the OpenShift shape, as ``bundle.json`` and a spec file hold it."""
    metadata: dict[str, Any] = {"name": image_set.name}
    if image_set.labels:
        metadata["labels"] = dict(image_set.labels)
    images = [{"name": str(ref)} for ref in image_set.images]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"pinnedImages": images},
    }


# ---------------------------------------------------------------- paths
def check_relative_path(path: str) -> str:
    """Accept a plain relative ``/``-separated path; refuse anything that could escape."""
    parts = path.split("/")
    is_bad = (
        not path
        or len(path) > MAX_PATH_CHARS
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or any(part in ("", ".", "..") or _too_long(part) for part in parts)
    )
    if is_bad:
        raise BundleUnsafePath(f"bundle manifest names an unsafe path {quoted(path, 200)}")
    return path


def check_file_name(name: str) -> str:
    """Accept one file name to create in a directory: no separator, no ``..``, not too long."""
    if "/" in name or name in ("", ".", "..") or "\0" in name or _too_long(name):
        raise BundleUnsafePath(f"{quoted(name, 200)} is not a safe file name")
    return name


def _too_long(name: str) -> bool:
    return len(name.encode(errors="surrogateescape")) > MAX_NAME_BYTES


def blob_path(layout: str, digest: str) -> str:
    """Where a blob lives in the bundle for ``layout``."""
    hex_part = digest.removeprefix("sha256:")
    if layout == "oci":
        return f"blobs/sha256/{hex_part}"
    return f"docker/registry/v2/blobs/sha256/{hex_part[:2]}/{hex_part}/data"


# ---------------------------------------------------------------- manifest
_KINDS: Final = {bool: "a boolean", int: "an integer", str: "a string", list: "a list",
                 dict: "an object", float: "a number", type(None): "null"}  # fmt: skip


def _kind(value: object) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _need(doc: Mapping[str, Any], key: str, kind: type, where: str = "bundle.json") -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        shown = "missing" if key not in doc else _kind(value)
        raise BundleManifestInvalid(f"{where}: {key} must be {_KINDS[kind]}, not {shown}")
    return value


def _objects(doc: Mapping[str, Any], key: str, where: str = "bundle.json") -> list[Any]:
    items: list[Any] = _need(doc, key, list, where)
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise BundleManifestInvalid(f"{where} {key}[{index}] must be an object")
    return items


def _size(doc: Mapping[str, Any], where: str) -> int:
    size: int = _need(doc, "sizeBytes", int, where)
    if not 0 <= size <= MAX_SIZE_BYTES:
        raise BundleManifestInvalid(f"{where}: sizeBytes must be 0 to {MAX_SIZE_BYTES}")
    return size


def _digest(text: object, where: str) -> str:
    if not isinstance(text, str) or not _DIGEST.match(text):
        raise BundleManifestInvalid(f"{where}: {quoted(text, 100)} is not a sha256:<64 hex> digest")
    return text


def _string(doc: Mapping[str, Any], key: str, pattern: re.Pattern[str], rule: str) -> str:
    text: str = _need(doc, key, str)
    if not pattern.match(text):
        raise BundleManifestInvalid(f"bundle.json: {key} {quoted(text, 100)} must be {rule}")
    return text


def _image(item: Mapping[str, Any], where: str) -> BundleImage:
    try:
        ref = parse_pinned_image_ref(_need(item, "name", str, where))
    except ImageReferenceInvalid as exc:
        raise BundleManifestInvalid(clip(f"{where}: {exc.message}", 400)) from None
    digest = _digest(item.get("manifestDigest"), where)
    if digest != ref.digest:
        raise BundleManifestInvalid(
            f"{where}: manifestDigest {digest} is not the digest of its name {ref}"
        )
    return BundleImage(ref, digest, _size(item, where))


def _images(doc: Mapping[str, Any]) -> tuple[BundleImage, ...]:
    images: dict[str, BundleImage] = {}
    for index, item in enumerate(_objects(doc, "images")):
        image = _image(item, f"bundle.json images[{index}]")
        if images.setdefault(str(image.ref), image) is not image:
            raise BundleManifestInvalid(f"bundle.json images[{index}]: {image.ref} listed twice")
    if not images:
        raise BundleManifestInvalid("bundle.json lists no images")
    return tuple(images.values())


def _blobs(doc: Mapping[str, Any], layout: str) -> dict[str, ExpectedFile]:
    files: dict[str, ExpectedFile] = {}
    for index, item in enumerate(_objects(doc, "blobs")):
        where = f"bundle.json blobs[{index}]"
        digest = _digest(item.get("digest"), where)
        path = blob_path(layout, digest)
        if path in files:
            raise BundleManifestInvalid(f"{where}: blob {digest} is listed twice")
        files[path] = ExpectedFile(path, _size(item, where), digest.removeprefix("sha256:"))
    return files


def _files(
    doc: Mapping[str, Any], layout: str, blobs: Mapping[str, ExpectedFile]
) -> tuple[ExpectedFile, ...]:
    files = dict(blobs)
    blob_dir = blob_path(layout, "sha256:").partition("/sha256/")[0] + "/"
    for index, item in enumerate(_objects(doc, "files")):
        where = f"bundle.json files[{index}]"
        path = check_relative_path(_need(item, "path", str, where))
        hex_part = _need(item, "sha256", str, where)
        if not _HEX.match(hex_part):
            raise BundleManifestInvalid(f"{where}: sha256 must be 64 lowercase hex digits")
        if path in (MANIFEST_NAME, SIGNATURE_NAME, ECDSA_SIGNATURE_NAME) or path in files:
            raise BundleManifestInvalid(f"{where}: {path} is listed twice")
        if path.startswith(blob_dir):
            raise BundleManifestInvalid(f"{where}: {path} is a blob's place; list it in blobs")
        files[path] = ExpectedFile(path, _size(item, where), hex_part)
    return tuple(sorted(files.values(), key=lambda f: f.path))


def _set(item: Mapping[str, Any], where: str) -> BundleSet:
    is_persistent = _need(item, "persistent", bool, where)
    try:
        image_set = parse_set_object(item.get("object"), source=where, is_persistent=is_persistent)
    except SpecInvalid as exc:
        raise BundleSetInvalid(clip(exc.message, 400)) from None
    for key, value in image_set.labels.items():
        if not _is_label(key, value):
            raise BundleSetInvalid(
                f"{where}: label {quoted(key, 80)}: {quoted(value, 80)} is not a Kubernetes "
                "label (a name of at most 63 characters, an optional DNS prefix, a value of "
                "at most 63)"
            )
    return BundleSet(is_persistent, image_set)


def _is_label(key: str, value: str) -> bool:
    prefix, _, name = key.rpartition("/")
    is_key = bool(_LABEL_NAME.match(name)) and (not prefix or bool(_LABEL_PREFIX.match(prefix)))
    return is_key and (not value or bool(_LABEL_NAME.match(value)))


def _sets(doc: Mapping[str, Any], images: Iterable[BundleImage]) -> tuple[BundleSet, ...]:
    carried = {image.ref for image in images}
    sets: dict[str, BundleSet] = {}
    items = _objects(doc, "pinnedImageSets") if "pinnedImageSets" in doc else []
    for index, item in enumerate(items):
        where = f"bundle.json pinnedImageSets[{index}]"
        found = _set(item, where)
        if sets.setdefault(found.name, found) is not found:
            raise BundleSetInvalid(f"{where}: PinnedImageSet {found.name} is carried twice")
        missing = [ref for ref in found.image_set.images if ref not in carried]
        if missing:
            raise BundleSetInvalid(
                f"{where}: PinnedImageSet {found.name} names {len(missing)} image(s) the bundle "
                f"does not carry, first {missing[0]}"
            )
    return tuple(sets.values())


def is_bundle_id(text: object) -> bool:
    """``bundleId``'s form: 1-128 of A-Z a-z 0-9 . _ -."""
    return isinstance(text, str) and _BUNDLE_ID.match(text) is not None


def is_manifest_digest(text: object) -> bool:
    """``sha256:<64 lowercase hex>``."""
    return isinstance(text, str) and _DIGEST.match(text) is not None


def count_values(data: bytes) -> int:
    """An upper bound of the values a JSON text holds (commas in strings count too)."""
    return data.count(b",") + data.count(b"[") + data.count(b"{")


def _document(data: bytes) -> dict[str, Any]:
    if count_values(data) > MAX_MANIFEST_VALUES:
        raise BundleManifestInvalid(
            f"bundle.json holds more than {MAX_MANIFEST_VALUES} values (objects, arrays, commas)"
        )
    try:
        doc = loads_json(
            data, what=MANIFEST_NAME, max_bytes=MAX_MANIFEST_BYTES, max_depth=MAX_MANIFEST_DEPTH
        )
    except MalformedInput as exc:
        raise BundleManifestInvalid(str(exc)) from None
    if not isinstance(doc, dict):
        raise BundleManifestInvalid(f"bundle.json must hold a JSON object, not {_kind(doc)}")
    version = doc.get("formatVersion")
    if type(version) is not int:  # not True, 1.0 or "1"
        raise BundleManifestInvalid(
            f"bundle.json: formatVersion must be the integer {_VERSIONS}, not {_kind(version)}"
        )
    if version not in FORMAT_VERSIONS:
        raise BundleFormatUnsupported(
            f"bundle format version {clip(version, 50)} is not supported (this nodeagent reads "
            f"versions {_VERSIONS}); use a bundle made for this nodeagent version"
        )
    return doc


def parse_manifest(data: bytes) -> BundleManifest:
    """Parse ``bundle.json`` — only ever called after its signature was verified."""
    doc = _document(data)
    bundle_id = _string(doc, "bundleId", _BUNDLE_ID, "1-128 of A-Z a-z 0-9 . _ -")
    created = _string(doc, "created", TIME_FORM, "an RFC 3339 UTC time (…T…Z)")
    architecture = _string(doc, "architecture", _ARCHITECTURE, "a GOARCH name such as amd64")
    layout = doc.get("layout", "oci")
    if layout not in _LAYOUTS:
        raise BundleManifestInvalid("bundle.json: layout must be 'oci' or 'registry-v2'")
    fresh = freshness_of(doc, created)
    target = target_of(doc)
    images = _images(doc)
    blobs = _blobs(doc, layout)
    listed = {f"sha256:{f.sha256_hex}": f for f in blobs.values()}
    manifest = BundleManifest(
        bundle_id=bundle_id,
        created=created,
        architecture=architecture,
        layout=layout,
        images=images,
        files=_files(doc, layout, blobs),
        sets=_sets(doc, images),
        blobs=listed,
        channel=fresh.channel,
        sequence=fresh.sequence,
        expires=fresh.expires,
        format_version=doc["formatVersion"],
        supersedes=fresh.supersedes,
        target=target,
        image_signatures=image_signatures_of(doc, [i.ref for i in images], listed),
        served_tags=served_tags_of(doc, [i.ref for i in images]),
        agent_image=agent_image_of(doc, [(i.ref, i.manifest_digest) for i in images]),
    )
    return replace(manifest, release=release_of(doc, manifest))

"""Manifests and indexes from a registry, a bundle or the manifest cache (pure, no I/O).

``read_manifest`` is the one reader of a manifest body: strict JSON
(``nodeagent.strict.loads_json``) of at most ``MAX_MANIFEST_BYTES`` nested at most
``MAX_MANIFEST_DEPTH`` deep, then every field it uses type-checked:

- the body is an object; ``schemaVersion``, when present, is the integer 2;
- ``mediaType`` (the body's, else the ``Content-Type``'s) is a string naming an OCI or
  Docker v2 image manifest or index; without one, the shape decides (OCI makes it
  optional);
- an image manifest has a ``config`` descriptor and a ``layers`` list of descriptors; an
  index a ``manifests`` list of descriptors, each with an optional ``platform`` object
  whose ``os``, ``architecture`` and ``variant`` are strings;
- a descriptor is an object with ``digest`` of the form ``sha256:<64 lower-case hex>``,
  ``size`` an integer from 0 to 2^53 - 1 and, when present, ``mediaType`` a string of at
  most ``MAX_MEDIA_TYPE_CHARS``.

Anything else raises ``ImageNotFound`` (the registry has no image nodeagent can use by
that digest: retrying does not change content addressed by its digest) with a clipped
message naming the reference and the field. ``parse_manifest`` and ``select_platform``
reduce a manifest to what disk admission needs (``nodeagent.disk.ImageLayers``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.errors import ImageNotFound
from nodeagent.registries.names import is_sha256_digest
from nodeagent.strict import MalformedInput, clip, loads_json, quoted

MEDIA_TYPE_OCI_INDEX: Final = "application/vnd.oci.image.index.v1+json"
MEDIA_TYPE_OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
MEDIA_TYPE_DOCKER_LIST: Final = "application/vnd.docker.distribution.manifest.list.v2+json"
MEDIA_TYPE_DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_MEDIA_TYPES: Final = frozenset({MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_DOCKER_LIST})
IMAGE_MEDIA_TYPES: Final = frozenset({MEDIA_TYPE_OCI_MANIFEST, MEDIA_TYPE_DOCKER_MANIFEST})
MANIFEST_ACCEPT: Final = ", ".join(
    [
        MEDIA_TYPE_OCI_INDEX,
        MEDIA_TYPE_OCI_MANIFEST,
        MEDIA_TYPE_DOCKER_LIST,
        MEDIA_TYPE_DOCKER_MANIFEST,
    ]
)
"""The Accept header for manifests: distribution 2.8 answers 404 for an unlisted stored type."""

MAX_MANIFEST_BYTES: Final = 4 * 1024 * 1024
"""Larger manifest bodies are refused (the distribution spec's and containers-image's limit)."""
MAX_CONFIG_BYTES: Final = 4 * 1024 * 1024
"""Larger image configs are refused (containers-image's limit for a config blob)."""
MAX_MANIFEST_DEPTH: Final = 32
"""Nesting of a manifest, an index or an image config; real ones stay below 6."""
MAX_SIZE_BYTES: Final = 2**53 - 1
"""The largest ``size`` a descriptor may give (the largest integer every JSON reader keeps)."""
MAX_MEDIA_TYPE_CHARS: Final = 255
"""RFC 6838's limit for a media type (127 for each half, plus the slash)."""
_MAX_PLATFORM_CHARS: Final = 64


@dataclass(frozen=True, slots=True)
class Platform:
    """An OCI platform; ``variant`` is empty when the architecture has none we care about."""

    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(part for part in (self.os, self.architecture, self.variant) if part)


LINUX_ARCHITECTURES: Final = frozenset(
    {"386", "amd64", "arm", "arm64", "loong64", "mips", "mipsle", "mips64", "mips64le",
     "ppc64", "ppc64le", "riscv64", "s390x"}
)  # fmt: skip
"""Go's GOARCH names for Linux, the names OCI platforms and CRI-O use
(docs/runtime-facts.md#oci-image-layout-and-distribution)."""

_MACHINE_TO_PLATFORM: Final[dict[str, tuple[str, str]]] = {
    "x86_64": ("amd64", ""),
    "amd64": ("amd64", ""),
    "aarch64": ("arm64", ""),
    "arm64": ("arm64", ""),
    "armv7l": ("arm", "v7"),
    "armv6l": ("arm", "v6"),
    "i386": ("386", ""),
    "i686": ("386", ""),
    "ppc64le": ("ppc64le", ""),
    "s390x": ("s390x", ""),
    "riscv64": ("riscv64", ""),
}


def node_platform(machine: str) -> Platform:
    """The Linux platform for a ``uname -m`` value (Go's GOARCH names): the one mapping
    nodeagent has (docs/runtime-facts.md#oci-image-layout-and-distribution)."""
    architecture, variant = _MACHINE_TO_PLATFORM.get(machine, (machine, ""))
    return Platform("linux", architecture, variant)


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A checked OCI descriptor; ``platform`` only for an index entry that gives one."""

    media_type: str
    digest: str
    size_bytes: int
    platform: Platform | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A checked manifest body: an image (``config`` and ``layers``) or an index
    (``manifests``); ``media_type`` is what the body or the header said, maybe empty."""

    is_index: bool
    media_type: str
    config: Descriptor | None = None
    layers: tuple[Descriptor, ...] = ()
    manifests: tuple[Descriptor, ...] = ()


@dataclass(frozen=True, slots=True)
class ImageManifest:
    """The parts of an image manifest that ``nodeagent.disk.ImageLayers`` needs."""

    config_size_bytes: int
    layers: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class ManifestIndex:
    """An OCI index or Docker manifest list: ``(digest, platform)`` per entry."""

    entries: tuple[tuple[str, Platform], ...]


class _Bad(Exception):
    """A field that breaks a rule; ``read_manifest`` turns it into ``ImageNotFound``."""


def verify_digest(body: bytes, digest: str) -> bool:
    """Whether ``body`` is the content ``digest`` (``sha256:<hex>``) names."""
    return digest == "sha256:" + hashlib.sha256(body).hexdigest()


def read_manifest(body: bytes, content_type: str = "", *, ref: str) -> Manifest:
    """A manifest body checked by the rules of the module docstring, or ``ImageNotFound``."""
    try:
        doc = loads_json(body, what="manifest", max_bytes=MAX_MANIFEST_BYTES,
                         max_depth=MAX_MANIFEST_DEPTH)  # fmt: skip
    except MalformedInput as err:
        raise ImageNotFound(f"{clip(ref)}: the registry's manifest is malformed: {err}") from None
    try:
        return _manifest(doc, content_type)
    except _Bad as err:
        raise ImageNotFound(f"{clip(ref)}: the registry's manifest is malformed: {err}") from None


def _manifest(doc: Any, content_type: str) -> Manifest:
    if not isinstance(doc, dict):
        raise _Bad("it is not a JSON object")
    version = doc.get("schemaVersion", 2)
    if type(version) is not int or version != 2:
        raise _Bad(f"schemaVersion is {clip(version, 20)}, only 2 is supported")
    media_type = _optional_str(doc, "mediaType", MAX_MEDIA_TYPE_CHARS)
    header_type = content_type.split(";", maxsplit=1)[0].strip()
    kind = _kind(doc, media_type or header_type)
    if kind == "index":
        entries = tuple(_descriptor(item, f"manifests[{i}]", is_entry=True)
                        for i, item in enumerate(_list(doc, "manifests")))  # fmt: skip
        return Manifest(True, media_type, manifests=entries)
    config = _descriptor(doc.get("config"), "config")
    layers = tuple(_descriptor(item, f"layers[{i}]") for i, item in enumerate(_list(doc, "layers")))
    return Manifest(False, media_type, config=config, layers=layers)


def _kind(doc: Mapping[str, Any], media_type: str) -> str:
    if media_type in INDEX_MEDIA_TYPES:
        return "index"
    if media_type in IMAGE_MEDIA_TYPES:
        return "image"
    if media_type:
        raise _Bad(f"unsupported media type {quoted(media_type, 100)}")
    if "manifests" in doc:  # OCI makes mediaType optional; the shape tells
        return "index"
    if "layers" in doc and "config" in doc:
        return "image"
    raise _Bad("it has no mediaType and is neither an image manifest nor an index")


def _list(doc: Mapping[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise _Bad(f"{key} is {_type_name(value)}, not a list")
    return value


def _descriptor(item: Any, where: str, *, is_entry: bool = False) -> Descriptor:
    if not isinstance(item, dict):
        raise _Bad(f"{where} is {_type_name(item)}, not an object")
    digest, size = item.get("digest"), item.get("size")
    if not isinstance(digest, str) or not is_sha256_digest(digest):
        raise _Bad(f"{where}.digest is {clip(repr(digest), 90)}, not sha256:<64 hex>")
    if type(size) is not int or not 0 <= size <= MAX_SIZE_BYTES:
        raise _Bad(f"{where}.size is {clip(repr(size), 40)}, not an integer from 0 to 2^53-1")
    media_type = _optional_str(item, "mediaType", MAX_MEDIA_TYPE_CHARS, where)
    platform = _platform(item.get("platform"), where) if is_entry else None
    return Descriptor(media_type, digest, size, platform)


def _platform(value: Any, where: str) -> Platform:
    if value is None:
        return Platform("", "")
    if not isinstance(value, dict):
        raise _Bad(f"{where}.platform is {_type_name(value)}, not an object")
    parts = (
        _optional_str(value, key, _MAX_PLATFORM_CHARS, f"{where}.platform")
        for key in ("os", "architecture", "variant")
    )
    return Platform(*parts)


def _optional_str(doc: Mapping[str, Any], key: str, limit: int, where: str = "") -> str:
    value = doc.get(key, "")
    name = f"{where}.{key}" if where else key
    if not isinstance(value, str):
        raise _Bad(f"{name} is {_type_name(value)}, not a string")
    if len(value) > limit:
        raise _Bad(f"{name} is {len(value)} characters, more than {limit}")
    return value


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "missing" if value is None else names.get(type(value), "a number")


def parse_manifest(body: bytes, content_type: str, *, ref: str) -> ImageManifest | ManifestIndex:
    """What disk admission needs of a verified manifest body (see ``read_manifest``)."""
    manifest = read_manifest(body, content_type, ref=ref)
    if manifest.is_index:
        return ManifestIndex(
            tuple((d.digest, d.platform or Platform("", "")) for d in manifest.manifests)
        )
    config_size = manifest.config.size_bytes if manifest.config else 0
    return ImageManifest(config_size, tuple((d.digest, d.size_bytes) for d in manifest.layers))


def read_image_config_platform(body: bytes, *, ref: str) -> tuple[str, str]:
    """``(os, architecture)`` of an image config blob, strictly read, or ``ImageNotFound``."""
    try:
        return _config_platform(body)
    except (MalformedInput, _Bad) as err:
        raise ImageNotFound(f"{clip(ref)}: its image config is malformed: {err}") from None


def _config_platform(body: bytes) -> tuple[str, str]:
    doc = loads_json(body, what="image config", max_bytes=MAX_CONFIG_BYTES,
                     max_depth=MAX_MANIFEST_DEPTH)  # fmt: skip
    if not isinstance(doc, dict):
        raise _Bad("it is not a JSON object")
    os_name = _optional_str(doc, "os", _MAX_PLATFORM_CHARS)
    return os_name, _optional_str(doc, "architecture", _MAX_PLATFORM_CHARS)


def select_platform(index: ManifestIndex, platform: Platform, *, ref: str) -> str:
    """The digest of the index entry for ``platform``: same variant first, then none."""
    candidates = [
        (digest, found)
        for digest, found in index.entries
        if (found.os, found.architecture) == (platform.os, platform.architecture)
    ]
    for wanted in (platform.variant, ""):
        for digest, found in candidates:
            if found.variant == wanted:
                return digest
    if candidates and not platform.variant:
        return candidates[0][0]
    offered = clip(", ".join(str(found) for _, found in index.entries) or "nothing")
    raise ImageNotFound(f"{clip(ref)}: no {platform} image in its index (it offers {offered})")

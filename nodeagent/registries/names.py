"""Registries as nodeagent sees them: image names, insecure hosts, manifests (pure, no I/O).

The distribution protocol's pure parts live here so that they can be tested
without a network and used by concern modules without importing an adapter:

* ``parse_docker_reference`` splits an image name the way docker and containers-image
  do (``docker.io`` is the default registry, ``library/`` its default namespace) into a
  ``DockerReference``; a PinnedImageSet's own, stricter names are
  ``references.PinnedImageRef``;
* ``insecure_registries`` reads the ``insecure = true`` entries of
  ``registries.conf`` and its drop-ins;
* ``verify_digest``, ``parse_manifest`` and ``select_platform`` turn manifest
  bodies into what disk admission needs (``nodeagent.disk.ImageLayers``);
* ``parse_challenge`` reads a ``WWW-Authenticate`` header, ``basic_authorization``
  answers a basic one, and ``status_error`` maps HTTP statuses to the error tree.

The HTTP side is ``nodeagent.adapters.registry.client``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.errors import (
    ConfigInvalid,
    ImageNotFound,
    ImageReferenceInvalid,
    NodeAgentError,
    RegistryAuthFailed,
    RegistryError,
    RegistryUnavailable,
)
from nodeagent.ports import RegistryCredentials

DOCKER_HUB: Final = "docker.io"
"""The canonical name of Docker Hub; its aliases below are normalized to it."""

DOCKER_HUB_ALIASES: Final = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

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

_SHA256_DIGEST: Final = re.compile(r"^sha256:[a-f0-9]{64}$")
_HOST: Final = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?$")
_PATH_COMPONENT: Final = re.compile(r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$")
_TAG: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


# ------------------------------------------------------------------------- image names


@dataclass(frozen=True, slots=True)
class DockerReference:
    """An image name by docker's and containers/image's rules (``docker.io`` the default host,
    ``library/`` its default namespace, tags allowed), split into its parts; ``registry`` is
    lower-case and normalized. Used where any image name may appear: credentials, mirrors,
    ``bundle create``. A PinnedImageSet's stricter names are ``references.PinnedImageRef``."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None


def normalize_registry(host: str) -> str:
    """Lower-case a registry host and map Docker Hub's aliases to ``docker.io``."""
    lowered = host.lower()
    return DOCKER_HUB if lowered in DOCKER_HUB_ALIASES else lowered


def parse_docker_reference(ref: str) -> DockerReference:
    """Split ``[host[:port]/]repo[:tag][@digest]`` (docker's rules for the default host)."""
    name, at, digest = ref.partition("@")
    if at and not re.fullmatch(r"[a-z0-9]+:[a-zA-Z0-9=_-]+", digest):
        raise ImageReferenceInvalid(f"image {ref!r}: {digest!r} is not a digest")
    tag = None
    if name.rfind(":") > name.rfind("/"):
        name, _, tag = name.rpartition(":")
        if not _TAG.fullmatch(tag):
            raise ImageReferenceInvalid(f"image {ref!r}: {tag!r} is not a tag")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, repository = normalize_registry(first), rest
    else:
        registry, repository = DOCKER_HUB, name
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    _check_name(ref, registry, repository)
    return DockerReference(registry, repository, tag, digest or None)


def _check_name(ref: str, registry: str, repository: str) -> None:
    if not _HOST.fullmatch(registry):
        raise ImageReferenceInvalid(f"image {ref!r}: {registry!r} is not a registry host")
    if not all(_PATH_COMPONENT.fullmatch(part) for part in repository.split("/")):
        raise ImageReferenceInvalid(
            f"image {ref!r}: repository {repository!r} must be lower-case path components"
        )


def is_sha256_digest(digest: str) -> bool:
    """Whether ``digest`` is ``sha256:`` and 64 lower-case hex digits."""
    return _SHA256_DIGEST.fullmatch(digest) is not None


def parse_docker_digest_reference(ref: str) -> DockerReference:
    """Like ``parse_docker_reference``, but the name must end ``@sha256:<64 hex>``."""
    parsed = parse_docker_reference(ref)
    if parsed.digest is None or not _SHA256_DIGEST.fullmatch(parsed.digest):
        raise ImageReferenceInvalid(f"image {ref!r} must be referenced by @sha256:<64 hex>")
    return parsed


# ------------------------------------------------------------------------- registries.conf


def insecure_registries(
    registries_conf_text: str,
    dropin_texts: Mapping[str, str],
    *,
    source: str = "registries.conf",
) -> frozenset[str]:
    """Locations that registries.conf marks ``insecure = true`` (plain HTTP, no TLS checks).

    ``dropin_texts`` maps each ``registries.conf.d`` file name to its text; they are
    applied after the main file in lexical name order, and a later ``[[registry]]``
    entry with the same ``prefix`` (or ``location``) replaces an earlier one, as in
    containers-image. Mirrors marked insecure count too; so does the v1 table
    ``[registries.insecure] registries = [...]``. Locations keep their namespace
    path, if any (``reg.example.com/team``); see ``is_insecure``.
    """
    flags: dict[str, bool] = {}
    v1: set[str] = set()
    texts = [(source, registries_conf_text), *sorted(dropin_texts.items())]
    for name, text in texts:
        doc = _load_toml(text, name)
        v1.update(_v1_insecure(doc, name))
        for entry in _table_list(doc, "registry", name):
            flags.update(_entry_flags(entry, name))
    return frozenset(v1 | {location for location, insecure in flags.items() if insecure})


def is_insecure(registry: str, repository: str, insecure: Iterable[str]) -> bool:
    """Whether ``registry/repository`` falls under one of the ``insecure`` locations."""
    segments = [registry, *repository.split("/")]
    for location in insecure:
        wanted = location.strip("/").split("/")
        wanted[0] = normalize_registry(wanted[0])
        if segments[: len(wanted)] == wanted:
            return True
    return False


def _load_toml(text: str, name: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigInvalid(f"{name}: not valid TOML ({err}); fix the file") from err


def _table_list(doc: Mapping[str, Any], key: str, name: str) -> list[Mapping[str, Any]]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ConfigInvalid(f"{name}: {key!r} must be an array of tables ([[{key}]])")
    return value


def _v1_insecure(doc: Mapping[str, Any], name: str) -> set[str]:
    table = doc.get("registries", {})
    found = table.get("insecure", {}).get("registries", []) if isinstance(table, dict) else []
    if not isinstance(found, list) or not all(isinstance(item, str) for item in found):
        raise ConfigInvalid(f"{name}: registries.insecure.registries must be a list of strings")
    return {item.strip("/") for item in found}


def _entry_flags(entry: Mapping[str, Any], name: str) -> dict[str, bool]:
    location = _string(entry, "location", name)
    key = _string(entry, "prefix", name) or location
    if not key:
        raise ConfigInvalid(f"{name}: a [[registry]] entry needs 'location' or 'prefix'")
    flags = {(location or key).strip("/"): _flag(entry, name)}
    for mirror in _table_list(entry, "mirror", name):
        mirror_location = _string(mirror, "location", name)
        if mirror_location:
            flags[mirror_location.strip("/")] = _flag(mirror, name)
    return flags


def _string(entry: Mapping[str, Any], key: str, name: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str):
        raise ConfigInvalid(f"{name}: {key!r} must be a string, got {value!r}")
    return value


def _flag(entry: Mapping[str, Any], name: str) -> bool:
    value = entry.get("insecure", False)
    if not isinstance(value, bool):
        raise ConfigInvalid(f"{name}: 'insecure' must be true or false, got {value!r}")
    return value


# ------------------------------------------------------------------------- manifests


@dataclass(frozen=True, slots=True)
class Platform:
    """An OCI platform; ``variant`` is empty when the architecture has none we care about."""

    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(part for part in (self.os, self.architecture, self.variant) if part)


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
    """The Linux platform for a ``uname -m`` value (Go's GOARCH names)."""
    architecture, variant = _MACHINE_TO_PLATFORM.get(machine, (machine, ""))
    return Platform("linux", architecture, variant)


@dataclass(frozen=True, slots=True)
class ImageManifest:
    """The parts of an image manifest that ``nodeagent.disk.ImageLayers`` needs."""

    config_size_bytes: int
    layers: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class ManifestIndex:
    """An OCI index or Docker manifest list: ``(digest, platform)`` per entry."""

    entries: tuple[tuple[str, Platform], ...]


def verify_digest(body: bytes, digest: str) -> bool:
    """Whether ``body`` is the content ``digest`` (``sha256:<hex>``) names."""
    return digest == "sha256:" + hashlib.sha256(body).hexdigest()


def parse_manifest(body: bytes, content_type: str, *, ref: str) -> ImageManifest | ManifestIndex:
    """Parse a verified manifest body; the media type is the body's, else the header's."""
    try:
        doc = _json_object(body)
        kind = _manifest_kind(doc, content_type)
        if kind == "index":
            return ManifestIndex(tuple(_index_entry(item) for item in doc["manifests"]))
        if kind == "image":
            layers = tuple(_descriptor(item) for item in doc["layers"])
            return ImageManifest(_descriptor(doc["config"])[1], layers)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ImageNotFound(f"{ref}: the registry's manifest is malformed ({err})") from err
    raise ImageNotFound(f"{ref}: unsupported manifest media type {kind!r}")


def _json_object(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise TypeError("not a JSON object")
    return doc


def _manifest_kind(doc: Mapping[str, Any], content_type: str) -> str:
    """``index``, ``image``, or the unsupported media type itself."""
    media_type = doc.get("mediaType") or content_type.split(";", maxsplit=1)[0].strip()
    if media_type in INDEX_MEDIA_TYPES:
        return "index"
    if media_type in IMAGE_MEDIA_TYPES:
        return "image"
    if "manifests" in doc:  # OCI makes mediaType optional; the shape tells
        return "index"
    if "layers" in doc and "config" in doc:
        return "image"
    return str(media_type)


def _descriptor(item: Any) -> tuple[str, int]:
    digest, size = item["digest"], item["size"]
    if not isinstance(digest, str) or not isinstance(size, int) or size < 0:
        raise ValueError(f"bad descriptor {digest!r} of size {size!r}")
    return digest, size


def _index_entry(item: Any) -> tuple[str, Platform]:
    platform = item.get("platform") or {}
    found = Platform(
        str(platform.get("os", "")),
        str(platform.get("architecture", "")),
        str(platform.get("variant", "")),
    )
    return _descriptor(item)[0], found


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
    offered = ", ".join(str(found) for _, found in index.entries) or "nothing"
    raise ImageNotFound(f"{ref}: no {platform} image in its index (it offers {offered})")


# ------------------------------------------------------------------------- HTTP answers


@dataclass(frozen=True, slots=True)
class Challenge:
    """A ``WWW-Authenticate`` challenge: ``scheme`` lower-case, ``params`` as given."""

    scheme: str
    params: Mapping[str, str]


_CHALLENGE_PARAM: Final = re.compile(
    r'\s*([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?'
)


def parse_challenge(header: str) -> Challenge:
    """Parse ``Bearer realm="...",service="...",scope="..."`` or ``Basic realm="..."``."""
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    for match in _CHALLENGE_PARAM.finditer(rest):
        quoted, bare = match.group(2), match.group(3)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        params[match.group(1).lower()] = value
    return Challenge(scheme.lower(), params)


def basic_authorization(credentials: RegistryCredentials) -> str | None:
    """The ``Authorization`` value for HTTP basic auth, or None without a user name."""
    if credentials.username:
        pair = f"{credentials.username}:{credentials.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()
    if credentials.auth:
        return f"Basic {credentials.auth}"
    return None


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` (lower-case key) in seconds when it is a number; dates are ignored."""
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except ValueError:
        return None


def status_error(
    status: int, headers: Mapping[str, str], *, ref: str, what: str
) -> NodeAgentError | None:
    """The error for a registry's answer to a GET of ``what``; None for 200."""
    if status == 200:
        return None
    if status in (401, 403):
        return RegistryAuthFailed(
            f"{ref}: the registry refused access to the {what} (HTTP {status}); "
            "check the pull secret's credentials for this registry"
        )
    if status == 404:
        return ImageNotFound(f"{ref}: the registry has no such {what} (HTTP 404)")
    if 500 <= status <= 599:
        return RegistryError(
            f"{ref}: the registry failed to serve the {what} (HTTP {status}); retrying later",
            retry_after_s=retry_after_s(headers),
        )
    return RegistryUnavailable(
        f"{ref}: the registry answered HTTP {status} for the {what}; retrying later",
        retry_after_s=retry_after_s(headers),
    )

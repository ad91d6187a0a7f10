"""The node's operating system image (pure): what ``/etc/os-release`` and the image tools say.

A site sees OS skew next to image readiness: the status carries ``osImage`` with the OS
release (``ID``, ``VERSION_ID``, ``VERSION``) and, on image-based hosts, the booted image
and its digest, from ``bootc status --format json`` or ``rpm-ostree status --json``
(docs/runtime-facts.md, "Node OS image", names the fields and their sources). Every input
is bounded and strict (``nodeagent.strict.loads_json``); a tool that is absent, fails or
prints something else leaves its part out, never a guess. Host interfaces: none (the
adapter ``adapters.nodeos`` reads the file and runs the tools).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from nodeagent.strict import MalformedInput, clip, loads_json

MAX_TOOL_OUTPUT_BYTES: Final = 1 << 20
"""A tool's JSON larger than this is refused (real outputs are a few KiB to ~100 KiB)."""
MAX_OS_RELEASE_BYTES: Final = 64 << 10
MAX_VALUE_CHARS: Final = 256
"""os-release values and image versions in the status; longer ones are clipped."""
MAX_IMAGE_CHARS: Final = 512
DIGEST_RE: Final = re.compile(r"sha256:[a-f0-9]{64}")
_OS_RELEASE_LINE: Final = re.compile(r"([A-Z][A-Z0-9_]{0,63})=(.*)")
_OS_RELEASE_KEYS: Final = ("ID", "VERSION_ID", "VERSION", "PRETTY_NAME")
_RPM_OSTREE_PREFIXES: Final = (
    "ostree-unverified-registry:",
    "ostree-unverified-image:",
    "ostree-image-signed:",
    "ostree-remote-registry:",
    "ostree-remote-image:",
)
"""ostree-rs-ext transports before the image name in ``container-image-reference``; a
``<remote>:`` follows ``ostree-remote-*:``."""

_REFERENCE: Final = "container-image-reference"
Tool = Literal["bootc", "rpm-ostree"]


@dataclass(frozen=True, slots=True)
class BootedImage:
    """The image the host booted: its name, digest (``sha256:…``) and OS version, if said."""

    tool: Tool
    image: str
    digest: str | None
    version: str | None = None


@dataclass(frozen=True, slots=True)
class OsImage:
    os_id: str | None
    version_id: str | None
    version: str | None
    pretty_name: str | None = None
    booted: BootedImage | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``osImage`` status field: only what is known."""
        doc: dict[str, Any] = {
            key: value
            for key, value in (
                ("id", self.os_id),
                ("versionId", self.version_id),
                ("version", self.version),
                ("prettyName", self.pretty_name),
            )
            if value is not None
        }
        if self.booted is not None:
            booted = {"source": self.booted.tool, "image": self.booted.image}
            if self.booted.digest is not None:
                booted["digest"] = self.booted.digest
            if self.booted.version is not None:
                booted["version"] = self.booted.version
            doc["booted"] = booted
        return doc


# ---------------------------------------------------------------- os-release
def parse_os_release(text: str) -> dict[str, str]:
    """os-release(5): ``KEY=value`` lines, values optionally quoted with ``"`` or ``'`` and
    backslash-escaped; comments and blank lines skipped; only the keys nodeagent reports."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _OS_RELEASE_LINE.fullmatch(line.strip())
        if match is None or match.group(1) not in _OS_RELEASE_KEYS:
            continue
        found[match.group(1)] = _bounded(_unquote(match.group(2).strip()))
    return found


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return re.sub(r"\\(.)", r"\1", value)


def _bounded(value: str, limit: int = MAX_VALUE_CHARS) -> str:
    return value if len(value) <= limit and value.isprintable() else clip(value, limit - 32)


# ---------------------------------------------------------------- bootc
def booted_from_bootc(data: bytes) -> BootedImage | None:
    """``bootc status --format json``: ``status.booted.image`` holds ``image.image`` (the
    reference), ``imageDigest`` and ``version``. None when the host booted no image
    (``status.booted`` null, or a booted entry without an image)."""
    doc = _tool_json(data, "bootc status --format json")
    booted = _path(doc, "status", "booted")
    if booted is None:
        return None
    image = _mapping(_path(booted, "image"), "status.booted.image", optional=True)
    if image is None:
        return None
    name = _string(_path(image, "image", "image"), "status.booted.image.image.image")
    if name is None:
        return None
    return BootedImage(
        "bootc",
        _bounded(name, MAX_IMAGE_CHARS),
        _digest(_path(image, "imageDigest"), "status.booted.image.imageDigest"),
        _optional_text(_path(image, "version"), "status.booted.image.version"),
    )


# ---------------------------------------------------------------- rpm-ostree
def booted_from_rpm_ostree(data: bytes) -> BootedImage | None:
    """``rpm-ostree status --json``: the deployment with ``booted`` true; its
    ``container-image-reference`` (a transport prefix, then the image) and
    ``container-image-reference-digest``, else its ostree ``checksum`` is not an image and
    None is returned. ``version`` is the OS version either way."""
    doc = _tool_json(data, "rpm-ostree status --json")
    deployments = _path(doc, "deployments")
    if not isinstance(deployments, list):
        raise MalformedInput("rpm-ostree status --json: no deployments list")
    booted = [d for d in deployments if isinstance(d, Mapping) and d.get("booted") is True]
    if len(booted) > 1:
        raise MalformedInput("rpm-ostree status --json: more than one booted deployment")
    if not booted:
        return None
    deployment = booted[0]
    reference = _string(deployment.get(_REFERENCE), _REFERENCE)
    if reference is None:
        return None
    return BootedImage(
        "rpm-ostree",
        _bounded(_image_of(reference), MAX_IMAGE_CHARS),
        _digest(
            deployment.get("container-image-reference-digest"), "container-image-reference-digest"
        ),
        _optional_text(deployment.get("version"), "version"),
    )


def _image_of(reference: str) -> str:
    """The image name of an ostree container reference: its transport prefix removed
    (``ostree-remote-registry:<remote>:`` with the remote), ``docker://`` too."""
    for prefix in _RPM_OSTREE_PREFIXES:
        if reference.startswith(prefix):
            rest = reference.removeprefix(prefix)
            if prefix.startswith("ostree-remote-"):
                rest = rest.partition(":")[2]
            if rest.startswith("registry:"):
                rest = rest.removeprefix("registry:")
            return rest.removeprefix("docker://")
    return reference


# ---------------------------------------------------------------- together
def os_image(
    os_release: str | None, *, bootc: BootedImage | None, rpm_ostree: BootedImage | None
) -> OsImage:
    """What the status reports: bootc's booted image before rpm-ostree's (bootc is the
    newer interface on the same hosts); None for what nothing said."""
    release = parse_os_release(os_release) if os_release is not None else {}
    return OsImage(
        os_id=release.get("ID"),
        version_id=release.get("VERSION_ID"),
        version=release.get("VERSION"),
        pretty_name=release.get("PRETTY_NAME"),
        booted=bootc or rpm_ostree,
    )


# ---------------------------------------------------------------- helpers
def _tool_json(data: bytes, what: str) -> Mapping[str, Any]:
    doc = loads_json(data, what=what, max_bytes=MAX_TOOL_OUTPUT_BYTES)
    if not isinstance(doc, Mapping):
        raise MalformedInput(f"{what}: not a JSON object")
    return doc


def _path(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _mapping(value: Any, where: str, *, optional: bool) -> Mapping[str, Any] | None:
    if value is None and optional:
        return None
    if not isinstance(value, Mapping):
        raise MalformedInput(f"{where} is not an object")
    return value


def _string(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise MalformedInput(f"{where} is not a string")
    return value or None


def _optional_text(value: Any, where: str) -> str | None:
    text = _string(value, where)
    return None if text is None else _bounded(text)


def _digest(value: Any, where: str) -> str | None:
    text = _string(value, where)
    if text is None:
        return None
    if not DIGEST_RE.fullmatch(text):
        raise MalformedInput(f"{where} {clip(text, 80)} is not a sha256 digest")
    return text

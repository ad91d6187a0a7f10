"""Image names by docker's and containers/image's rules (pure, no I/O).

``parse_docker_reference`` splits an image name the way docker and containers-image do
(``docker.io`` is the default registry, ``library/`` its default namespace) into a
``DockerReference``; a PinnedImageSet's own, stricter names are
``references.PinnedImageRef``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from nodeagent.errors import ImageReferenceInvalid
from nodeagent.strict import quoted

DOCKER_HUB: Final = "docker.io"
"""The canonical name of Docker Hub; its aliases below are normalized to it."""

DOCKER_HUB_ALIASES: Final = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

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


def repository_name(host: str, repository: str) -> str:
    """``host/repository`` as containers/image matches it: Docker Hub's aliases become
    ``docker.io`` and its one-segment names gain ``library/``."""
    host = normalize_registry(host)
    if host == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    return f"{host}/{repository}"


def parse_docker_reference(ref: str) -> DockerReference:
    """Split ``[host[:port]/]repo[:tag][@digest]`` (docker's rules for the default host)."""
    name, at, digest = ref.partition("@")
    if at and not re.fullmatch(r"[a-z0-9]+:[a-zA-Z0-9=_-]+", digest):
        raise ImageReferenceInvalid(f"image {quoted(ref)}: {quoted(digest, 80)} is not a digest")
    tag = None
    if name.rfind(":") > name.rfind("/"):
        name, _, tag = name.rpartition(":")
        if not _TAG.fullmatch(tag):
            raise ImageReferenceInvalid(f"image {quoted(ref)}: {quoted(tag, 140)} is not a tag")
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
        raise ImageReferenceInvalid(
            f"image {quoted(ref)}: {quoted(registry, 80)} is not a registry host"
        )
    if not all(_PATH_COMPONENT.fullmatch(part) for part in repository.split("/")):
        raise ImageReferenceInvalid(
            f"image {quoted(ref)}: repository {quoted(repository, 120)} must be lower-case "
            "path components"
        )


def is_sha256_digest(digest: str) -> bool:
    """Whether ``digest`` is ``sha256:`` and 64 lower-case hex digits."""
    return _SHA256_DIGEST.fullmatch(digest) is not None


def parse_docker_digest_reference(ref: str) -> DockerReference:
    """Like ``parse_docker_reference``, but the name must end ``@sha256:<64 hex>``."""
    parsed = parse_docker_reference(ref)
    if parsed.digest is None or not _SHA256_DIGEST.fullmatch(parsed.digest):
        raise ImageReferenceInvalid(f"image {quoted(ref)} must be referenced by @sha256:<64 hex>")
    return parsed

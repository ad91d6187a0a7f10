"""Image references as a PinnedImageSet accepts them: ``host[:port]/[namespace/]name@sha256:<hex>``.

The OpenShift CRD (``ImageDigestFormat`` in openshift/api) has two rules: exactly
one ``@`` with ``sha256:<64 lowercase hex>`` after it, and before it a host with
a dot, an optional 2-5 digit port, at most one namespace segment and a name;
at most 447 characters in all. ``parse_pinned_image_ref`` applies the same rules, and
when one fails it says which part is wrong instead of quoting the regex. (Image names by
docker's looser rules, with default host and tags, are ``registries.DockerReference``.)

One deliberate difference: the CRD's expression lets the namespace or the name
be empty (``quay.io/@sha256:…``, ``quay.io//app@sha256:…``). No registry can
serve such a name, so it is rejected here, at load time, with a clear message
rather than later as a failed pull.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodeagent.errors import ImageReferenceInvalid
from nodeagent.strict import clip

__all__ = ["PinnedImageRef", "MAX_REFERENCE_LENGTH", "parse_pinned_image_ref"]

MAX_REFERENCE_LENGTH = 447
"""The CRD's ``maxLength`` for ``spec.pinnedImages[].name``."""

_DIGEST_RE = re.compile(r"sha256:[a-f0-9]{64}")
# The CRD's expression for the part before '@'; '[a-zA-Z0-9-_]' written unambiguously.
_NAME_RE = re.compile(
    r"([a-zA-Z0-9-]+\.)+[a-zA-Z0-9-]+(:[0-9]{2,5})?/([a-zA-Z0-9_-]{0,61}/)?[a-zA-Z0-9_.-]*?"
)
_HOST_RE = re.compile(r"([a-zA-Z0-9-]+\.)+[a-zA-Z0-9-]+")
_PORT_RE = re.compile(r"[0-9]{2,5}")
_NAMESPACE_RE = re.compile(r"[a-zA-Z0-9_-]{1,61}")
_IMAGE_NAME_RE = re.compile(r"[a-zA-Z0-9_.-]+")
_TAG_RE = re.compile(r"[\w][\w.-]{0,127}")
_EXAMPLE = "NAME@sha256:<64 hex>, e.g. quay.io/ns/app@sha256:…"


@dataclass(frozen=True, slots=True)
class PinnedImageRef:
    """A validated digest reference, e.g. ``quay.io/openshift/app@sha256:…``."""

    host: str
    """Registry host with its port when one is given (``127.0.0.1:5000``), as auth files key it."""
    repository: str
    """Path after the host: ``name`` or ``namespace/name``."""
    digest: str
    """``sha256:`` followed by 64 lowercase hex digits."""

    def __str__(self) -> str:
        return f"{self.host}/{self.repository}@{self.digest}"

    @property
    def name(self) -> str:
        """The reference without its digest: ``host[:port]/repository``."""
        return f"{self.host}/{self.repository}"

    @property
    def registry_host(self) -> str:
        """The host name alone, without the port (``127.0.0.1`` for ``127.0.0.1:5000``)."""
        return self.host.partition(":")[0]

    @property
    def port(self) -> int | None:
        """The registry port, or None when the reference names none (HTTPS default)."""
        _, _, port = self.host.partition(":")
        return int(port) if port else None


def parse_pinned_image_ref(text: str) -> PinnedImageRef:
    """Validate ``text`` as the CRD does and split it; ImageReferenceInvalid says what is wrong."""
    if len(text) > MAX_REFERENCE_LENGTH:
        raise _invalid(
            text[:40] + "…",
            f"is {len(text)} characters long; the API allows at most {MAX_REFERENCE_LENGTH}",
        )
    name, digest = _split_digest(text)
    _check_digest(text, digest)
    host, repository = _split_host(text, name)
    _check_host(text, host)
    _check_repository(text, repository)
    if _NAME_RE.fullmatch(name) is None:  # safety net: the diagnostics above missed a case
        raise _invalid(text, "does not match the API's image reference format")
    return PinnedImageRef(host=host, repository=repository, digest=digest)


def _invalid(text: str, problem: str) -> ImageReferenceInvalid:
    return ImageReferenceInvalid(f"{clip(text, 200)} {problem}")


def _split_digest(text: str) -> tuple[str, str]:
    count = text.count("@")
    if count == 1:
        name, _, digest = text.partition("@")
        return name, digest
    if count > 1:
        raise _invalid(text, f"contains {count} '@' characters; exactly one is allowed")
    last = text.rpartition("/")[2]
    if "/" in text and ":" in last and _TAG_RE.fullmatch(last.rpartition(":")[2]):
        raise _invalid(
            text, f"is a tag reference; PinnedImageSets need a digest reference {_EXAMPLE}"
        )
    raise _invalid(text, f"has no digest; PinnedImageSets need a digest reference {_EXAMPLE}")


def _check_digest(text: str, digest: str) -> None:
    if _DIGEST_RE.fullmatch(digest):
        return
    algorithm, colon, hex_part = digest.partition(":")
    if not colon:
        raise _invalid(
            text, f"has digest '{clip(digest[:20], 80)}', which is not of the form sha256:<hex>"
        )
    if algorithm != "sha256":
        raise _invalid(
            text, f"uses digest algorithm '{clip(algorithm, 80)}'; only sha256 is accepted"
        )
    if re.fullmatch(r"[a-fA-F0-9]*", hex_part) is None:
        raise _invalid(text, "has a digest with characters other than 0-9 and a-f")
    if hex_part.lower() != hex_part:
        raise _invalid(text, "has a digest with uppercase hex digits; write them in lowercase")
    raise _invalid(text, f"has a digest of {len(hex_part)} hex digits; sha256 needs 64")


def _split_host(text: str, name: str) -> tuple[str, str]:
    host, slash, repository = name.partition("/")
    if not slash:
        raise _invalid(
            text,
            f"has no registry host: '{clip(name, 80)}' must be prefixed by one, "
            f"e.g. quay.io/{clip(name, 80)}",
        )
    return host, repository


def _check_host(text: str, host: str) -> None:
    hostname, colon, port = host.partition(":")
    if "." not in hostname:
        raise ImageReferenceInvalid(
            f"{clip(text, 200)}: registry host '{clip(hostname, 80)}' has no dot; the API needs "
            "a fully qualified host such as quay.io or registry.example.com:5000"
        )
    if _HOST_RE.fullmatch(hostname) is None:
        raise ImageReferenceInvalid(
            f"{clip(text, 200)}: registry host '{clip(hostname, 80)}' is not dot-separated "
            "labels of letters, digits and '-'"
        )
    if colon and _PORT_RE.fullmatch(port) is None:
        raise ImageReferenceInvalid(
            f"{clip(text, 200)}: registry port '{clip(port, 80)}' is not a number of 2 to 5 digits"
        )


def _check_repository(text: str, repository: str) -> None:
    segments = repository.split("/")
    if len(segments) > 2:
        raise _invalid(
            text,
            f"has {len(segments)} path segments after the host; the API allows at most one "
            "namespace segment (host/namespace/name)",
        )
    if len(segments) == 2:
        _check_namespace(text, segments[0])
    image_name = segments[-1]
    if ":" in image_name:
        tag = image_name.partition(":")[2]
        raise _invalid(text, f"has both a tag and a digest; drop the tag ':{tag}'")
    if _IMAGE_NAME_RE.fullmatch(image_name) is None:
        what = "an empty image name" if not image_name else f"image name '{clip(image_name, 80)}'"
        raise _invalid(text, f"has {what}; use letters, digits, '-', '_' and '.'")


def _check_namespace(text: str, namespace: str) -> None:
    if _NAMESPACE_RE.fullmatch(namespace) is None:
        what = "an empty namespace" if not namespace else f"namespace '{clip(namespace, 80)}'"
        raise _invalid(text, f"has {what}; use 1 to 61 letters, digits, '-' and '_'")

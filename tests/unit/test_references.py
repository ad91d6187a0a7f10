"""Unit tests of image reference validation against the PinnedImageSet CRD's rules."""

from __future__ import annotations

import re

import pytest

from nodeagent.errors import ImageReferenceInvalid, SpecInvalid
from nodeagent.references import MAX_REFERENCE_LENGTH, PinnedImageRef, parse_pinned_image_ref

DIGEST = "sha256:" + "0123456789abcdef" * 4
# The CRD's two CEL rules, copied verbatim from openshift/api (docs/runtime-facts.md), as an
# independent oracle.
CRD_NAME = re.compile(
    r"^([a-zA-Z0-9-]+\.)+[a-zA-Z0-9-]+(:[0-9]{2,5})?/([a-zA-Z0-9-_]{0,61}/)?[a-zA-Z0-9-_.]*?$"
)
CRD_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")


def crd_accepts(text: str) -> bool:
    if len(text) > MAX_REFERENCE_LENGTH or text.count("@") != 1:
        return False
    name, _, digest = text.partition("@")
    return bool(CRD_NAME.match(name) and CRD_DIGEST.match(digest))


def with_length(length: int) -> str:
    """A valid-looking reference of exactly ``length`` characters."""
    fixed = len("quay.io/") + len("@") + len(DIGEST)
    return f"quay.io/{'a' * (length - fixed)}@{DIGEST}"


VALID = [
    (f"quay.io/openshift/app@{DIGEST}", "quay.io", "openshift/app"),
    (f"quay.io/app@{DIGEST}", "quay.io", "app"),
    (f"127.0.0.1:5000/ns/app@{DIGEST}", "127.0.0.1:5000", "ns/app"),
    (
        f"registry.example.com:12345/a_b-c/x.y-z_1@{DIGEST}",
        "registry.example.com:12345",
        "a_b-c/x.y-z_1",
    ),
    (f"my-registry.local:80/{'n' * 61}/app@{DIGEST}", "my-registry.local:80", f"{'n' * 61}/app"),
    (f"Quay.IO/Team/App@{DIGEST}", "Quay.IO", "Team/App"),
    (with_length(MAX_REFERENCE_LENGTH), "quay.io", "a" * 367),
]


@pytest.mark.parametrize(("text", "host", "repository"), VALID)
def test_valid_references_split_into_host_repository_and_digest(
    text: str, host: str, repository: str
) -> None:
    ref = parse_pinned_image_ref(text)
    assert ref == PinnedImageRef(host=host, repository=repository, digest=DIGEST)
    assert str(ref) == text
    assert ref.name == f"{host}/{repository}"
    assert crd_accepts(text)


@pytest.mark.parametrize(
    ("text", "registry_host", "port"),
    [
        (f"quay.io/app@{DIGEST}", "quay.io", None),
        (f"127.0.0.1:5000/app@{DIGEST}", "127.0.0.1", 5000),
        (f"registry.example.com:443/ns/app@{DIGEST}", "registry.example.com", 443),
    ],
)
def test_registry_host_and_port_are_split(text: str, registry_host: str, port: int | None) -> None:
    ref = parse_pinned_image_ref(text)
    assert (ref.registry_host, ref.port) == (registry_host, port)


# (reference, what the message must say, whether the CRD itself accepts it)
INVALID = [
    ("quay.io/app:1.0", "quay.io/app:1.0 is a tag reference; PinnedImageSets need a digest", False),
    ("quay.io/app", "has no digest", False),
    (f"app/x@{DIGEST}", "registry host 'app' has no dot", False),
    (f"localhost:5000/app@{DIGEST}", "registry host 'localhost' has no dot", False),
    (f"app@{DIGEST}", "has no registry host", False),
    (f"my_reg.io/app@{DIGEST}", "registry host 'my_reg.io' is not dot-separated labels", False),
    (f"quay..io/app@{DIGEST}", "registry host 'quay..io' is not dot-separated labels", False),
    (f"quay.io/a/b/c@{DIGEST}", "at most one namespace segment", False),
    (f"quay.io/{'n' * 62}/app@{DIGEST}", f"namespace '{'n' * 62}'", False),
    (f"quay.io/a.b/app@{DIGEST}", "namespace 'a.b'", False),
    ("quay.io/app@sha256:" + "A" * 64, "uppercase hex digits", False),
    ("quay.io/app@sha256:" + "a" * 63, "a digest of 63 hex digits; sha256 needs 64", False),
    ("quay.io/app@sha256:" + "a" * 65, "a digest of 65 hex digits", False),
    ("quay.io/app@sha256:" + "g" * 64, "characters other than 0-9 and a-f", False),
    ("quay.io/app@sha512:" + "a" * 128, "digest algorithm 'sha512'", False),
    ("quay.io/app@" + "a" * 64, "not of the form sha256:<hex>", False),
    (
        with_length(MAX_REFERENCE_LENGTH + 1),
        "is 448 characters long; the API allows at most 447",
        False,
    ),
    (f"quay.io:5/app@{DIGEST}", "registry port '5' is not a number of 2 to 5 digits", False),
    (f"quay.io:123456/app@{DIGEST}", "registry port '123456'", False),
    (f"quay.io:http/app@{DIGEST}", "registry port 'http'", False),
    (f"quay.io/app@{DIGEST}@{DIGEST}", "contains 2 '@' characters", False),
    (f"quay.io/app:1.0@{DIGEST}", "has both a tag and a digest; drop the tag ':1.0'", False),
    (f"quay.io/ns/app$@{DIGEST}", "image name 'app$'", False),
    # Stricter than the CRD on purpose: no registry can serve an empty path segment.
    (f"quay.io/@{DIGEST}", "an empty image name", True),
    (f"quay.io//app@{DIGEST}", "an empty namespace", True),
    (f"quay.io/ns/@{DIGEST}", "an empty image name", True),
]


@pytest.mark.parametrize(("text", "fragment", "is_crd_valid"), INVALID)
def test_invalid_references_say_what_is_wrong(text: str, fragment: str, is_crd_valid: bool) -> None:
    with pytest.raises(ImageReferenceInvalid) as caught:
        parse_pinned_image_ref(text)
    assert fragment in caught.value.message
    assert crd_accepts(text) is is_crd_valid


def test_reference_errors_are_spec_errors_with_their_own_reason() -> None:
    with pytest.raises(SpecInvalid) as caught:
        parse_pinned_image_ref("quay.io/app:latest")
    assert caught.value.reason == "ImageReferenceInvalid"

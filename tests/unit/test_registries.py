"""Unit tests of the pure registry module: names, registries.conf, manifests, challenges."""

from __future__ import annotations

import hashlib
import json

import pytest

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
from nodeagent.registries import (
    MANIFEST_ACCEPT,
    MEDIA_TYPE_DOCKER_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST,
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
    DockerReference,
    ImageManifest,
    ManifestIndex,
    Platform,
    basic_authorization,
    insecure_registries,
    is_insecure,
    is_sha256_digest,
    node_platform,
    parse_docker_digest_reference,
    parse_docker_reference,
    parse_manifest,
    pick_challenge,
    select_platform,
    status_error,
    verify_digest,
)

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
REF = f"127.0.0.1:5000/app@{DIGEST}"
NOW_S = 1445412390.0
"""Unix time 90 s before Wed, 21 Oct 2015 07:28:00 GMT."""

# ------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("nginx", DockerReference("docker.io", "library/nginx")),
        ("nginx:1.25", DockerReference("docker.io", "library/nginx", tag="1.25")),
        ("bitnami/redis", DockerReference("docker.io", "bitnami/redis")),
        ("index.docker.io/x/y", DockerReference("docker.io", "x/y")),
        ("Quay.IO/ns/app:v1", DockerReference("quay.io", "ns/app", tag="v1")),
        (f"quay.io/ns/app@{DIGEST}", DockerReference("quay.io", "ns/app", digest=DIGEST)),
        (
            f"127.0.0.1:5000/a/b/c:t@{DIGEST}",
            DockerReference("127.0.0.1:5000", "a/b/c", "t", DIGEST),
        ),
        ("localhost/app", DockerReference("localhost", "app")),
        ("localhost:5000/app", DockerReference("localhost:5000", "app")),
        ("host:5000/app", DockerReference("host:5000", "app")),
        ("my-ns/app", DockerReference("docker.io", "my-ns/app")),
    ],
)
def test_parse_reference(ref: str, expected: DockerReference) -> None:
    assert parse_docker_reference(ref) == expected


@pytest.mark.parametrize(
    "ref",
    ["quay.io/NS/app", "quay.io/ns//app", "quay.io/", "quay.io/app@nodigest", "app:bad tag", ""],
)
def test_parse_reference_rejects_bad_names(ref: str) -> None:
    with pytest.raises(ImageReferenceInvalid):
        parse_docker_reference(ref)


@pytest.mark.parametrize(
    "ref",
    ["quay.io/app:v1", "quay.io/app@sha512:" + "ab" * 64, "quay.io/app@sha256:" + "AB" * 32],
)
def test_digest_reference_needs_sha256(ref: str) -> None:
    with pytest.raises(ImageReferenceInvalid, match="sha256"):
        parse_docker_digest_reference(ref)


def test_is_sha256_digest() -> None:
    assert is_sha256_digest(DIGEST)
    assert not is_sha256_digest(DIGEST[:-1])
    assert not is_sha256_digest("../../etc/passwd")


# ------------------------------------------------------------------------- registries.conf

MAIN_CONF = """
unqualified-search-registries = ["quay.io"]

[[registry]]
location = "127.0.0.1:5000"
insecure = true

[[registry]]
prefix = "example.com/team"
location = "mirror.local:8443/team"
insecure = true

[[registry]]
location = "quay.io"

[[registry.mirror]]
location = "cache.local:5000"
insecure = true

[[registry]]
location = "later.local"
insecure = true
"""


def test_insecure_registries_from_main_file() -> None:
    assert insecure_registries(MAIN_CONF, {}) == {
        "127.0.0.1:5000",
        "mirror.local:8443/team",
        "cache.local:5000",
        "later.local",
    }


def test_dropins_apply_in_name_order_and_replace_entries() -> None:
    dropins = {
        "20-secure.conf": '[[registry]]\nlocation = "later.local"\ninsecure = false\n',
        "10-insecure.conf": '[[registry]]\nlocation = "later.local"\ninsecure = true\n'
        '[[registry]]\nlocation = "extra.local:5000/"\ninsecure = true\n',
    }
    found = insecure_registries(MAIN_CONF, dropins)
    assert "later.local" not in found
    assert "extra.local:5000" in found


def test_v1_insecure_table() -> None:
    text = '[registries.insecure]\nregistries = ["old.local:5000"]\n'
    assert insecure_registries(text, {}) == {"old.local:5000"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[registry]\n", "not valid TOML"),
        ('[[registry]]\nlocation = "a"\ninsecure = "yes"\n', "'insecure' must be true or false"),
        ("[[registry]]\ninsecure = true\n", "needs 'location' or 'prefix'"),
        ('registry = "a"\n', "array of tables"),
        ("[[registry]]\nlocation = 5\n", "'location' must be a string"),
        ('[registries.insecure]\nregistries = "a"\n', "list of strings"),
    ],
)
def test_bad_registries_conf_names_the_file(text: str, message: str) -> None:
    with pytest.raises(ConfigInvalid, match=message) as caught:
        insecure_registries("", {"50-bad.conf": text})
    assert "50-bad.conf" in str(caught.value)


@pytest.mark.parametrize(
    ("registry", "repository", "expected"),
    [
        ("127.0.0.1:5000", "app", True),
        ("127.0.0.1:5001", "app", False),
        ("mirror.local:8443", "team/app", True),
        ("mirror.local:8443", "teamx/app", False),
        ("mirror.local:8443", "other", False),
        ("docker.io", "library/x", True),  # index.docker.io in the set below
    ],
)
def test_is_insecure(registry: str, repository: str, expected: bool) -> None:
    insecure = {"127.0.0.1:5000", "mirror.local:8443/team", "index.docker.io"}
    assert is_insecure(registry, repository, insecure) is expected


# ------------------------------------------------------------------------- platforms


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        ("x86_64", Platform("linux", "amd64")),
        ("aarch64", Platform("linux", "arm64")),
        ("armv7l", Platform("linux", "arm", "v7")),
        ("i686", Platform("linux", "386")),
        ("ppc64le", Platform("linux", "ppc64le")),
        ("s390x", Platform("linux", "s390x")),
        ("mips64", Platform("linux", "mips64")),
    ],
)
def test_node_platform(machine: str, expected: Platform) -> None:
    assert node_platform(machine) == expected


def _index(*platforms: dict[str, str]) -> ManifestIndex:
    doc = {
        "schemaVersion": 2,
        "manifests": [
            {"digest": f"sha256:{i:064x}", "size": 100, "platform": p}
            for i, p in enumerate(platforms)
        ],
    }
    parsed = parse_manifest(json.dumps(doc).encode(), "", ref=REF)
    assert isinstance(parsed, ManifestIndex)
    return parsed


AMD64 = {"os": "linux", "architecture": "amd64"}
ARM64_V8 = {"os": "linux", "architecture": "arm64", "variant": "v8"}
ARM_V6 = {"os": "linux", "architecture": "arm", "variant": "v6"}
ARM_V7 = {"os": "linux", "architecture": "arm", "variant": "v7"}
ARM = {"os": "linux", "architecture": "arm"}
ATTESTATION = {"os": "unknown", "architecture": "unknown"}


@pytest.mark.parametrize(
    ("platforms", "node", "expected_index"),
    [
        ([ATTESTATION, ARM64_V8, AMD64], Platform("linux", "amd64"), 2),
        ([AMD64, ARM64_V8], Platform("linux", "arm64"), 1),  # any variant when we want none
        ([ARM_V6, ARM_V7, ARM], Platform("linux", "arm", "v7"), 1),
        ([ARM_V6, ARM], Platform("linux", "arm", "v7"), 1),  # no variant before another one
        ([{"os": "windows", "architecture": "amd64"}, AMD64], Platform("linux", "amd64"), 1),
    ],
)
def test_select_platform(
    platforms: list[dict[str, str]], node: Platform, expected_index: int
) -> None:
    assert select_platform(_index(*platforms), node, ref=REF) == f"sha256:{expected_index:064x}"


def test_select_platform_without_a_match_lists_what_is_offered() -> None:
    with pytest.raises(ImageNotFound, match=r"no linux/s390x image.*linux/amd64, linux/arm/v6"):
        select_platform(_index(AMD64, ARM_V6), Platform("linux", "s390x"), ref=REF)
    with pytest.raises(ImageNotFound, match=REF):
        select_platform(_index(ARM_V6), Platform("linux", "arm", "v7"), ref=REF)


# ------------------------------------------------------------------------- manifests


def test_verify_digest() -> None:
    body = b'{"schemaVersion":2}'
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    assert verify_digest(body, digest)
    assert not verify_digest(body + b" ", digest)
    assert not verify_digest(body, digest.upper())
    assert not verify_digest(body, "sha512:" + hashlib.sha256(body).hexdigest())


def _image_doc(media_type: str | None = MEDIA_TYPE_OCI_MANIFEST) -> dict[str, object]:
    doc: dict[str, object] = {
        "schemaVersion": 2,
        "config": {"mediaType": "x", "digest": OTHER, "size": 321},
        "layers": [{"digest": DIGEST, "size": 1000}, {"digest": OTHER, "size": 0}],
    }
    if media_type is not None:
        doc["mediaType"] = media_type
    return doc


EXPECTED_IMAGE = ImageManifest(321, ((DIGEST, 1000), (OTHER, 0)))


@pytest.mark.parametrize(
    ("doc", "content_type"),
    [
        (_image_doc(), ""),
        (_image_doc(MEDIA_TYPE_DOCKER_MANIFEST), "application/json"),
        (_image_doc(None), MEDIA_TYPE_DOCKER_MANIFEST + "; charset=utf-8"),
        (_image_doc(None), ""),  # OCI: mediaType is optional, the shape tells
    ],
)
def test_parse_image_manifest(doc: dict[str, object], content_type: str) -> None:
    assert parse_manifest(json.dumps(doc).encode(), content_type, ref=REF) == EXPECTED_IMAGE


@pytest.mark.parametrize("media_type", [MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_DOCKER_LIST])
def test_parse_index(media_type: str) -> None:
    doc = {"mediaType": media_type, "manifests": [{"digest": DIGEST, "size": 5, "platform": AMD64}]}
    parsed = parse_manifest(json.dumps(doc).encode(), "", ref=REF)
    assert parsed == ManifestIndex(((DIGEST, Platform("linux", "amd64")),))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "malformed"),
        (b"[]", "malformed"),
        (
            json.dumps({**_image_doc(), "layers": [{"digest": DIGEST, "size": -1}]}).encode(),
            "malformed",
        ),
        (json.dumps({**_image_doc(), "layers": [{"digest": DIGEST}]}).encode(), "malformed"),
        (json.dumps({**_image_doc(), "layers": [{"digest": 1, "size": 1}]}).encode(), "malformed"),
        (json.dumps({"mediaType": MEDIA_TYPE_OCI_INDEX, "manifests": [3]}).encode(), "malformed"),
        (json.dumps({"schemaVersion": 1, "fsLayers": []}).encode(), "only 2 is supported"),
        (json.dumps({"mediaType": "application/vnd.example+json"}).encode(), "application/vnd"),
    ],
)
def test_bad_manifests_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(ImageNotFound, match=message) as caught:
        parse_manifest(body, "", ref=REF)
    assert REF in str(caught.value)


def test_accept_header_lists_every_supported_media_type() -> None:
    for media_type in (
        MEDIA_TYPE_OCI_INDEX,
        MEDIA_TYPE_OCI_MANIFEST,
        MEDIA_TYPE_DOCKER_LIST,
        MEDIA_TYPE_DOCKER_MANIFEST,
    ):
        assert media_type in MANIFEST_ACCEPT.split(", ")


# ------------------------------------------------------------------------- challenges


@pytest.mark.parametrize(
    ("header", "scheme", "params"),
    [
        ('Basic realm="registry"', "basic", {"realm": "registry"}),
        (
            'Bearer realm="https://auth.example.com/token",service="reg",'
            'scope="repository:a/b:pull,push"',
            "bearer",
            {
                "realm": "https://auth.example.com/token",
                "service": "reg",
                "scope": "repository:a/b:pull,push",
            },
        ),
        (
            'bearer Realm = "x", error="insufficient_scope"',
            "bearer",
            {"realm": "x", "error": "insufficient_scope"},
        ),
        (
            "Bearer realm=http://x/token,service=reg",
            "bearer",
            {"realm": "http://x/token", "service": "reg"},
        ),
        ('Basic realm="a \\"quoted\\" realm"', "basic", {"realm": 'a "quoted" realm'}),
        ("", "", {}),
    ],
)
def test_pick_challenge(header: str, scheme: str, params: dict[str, str]) -> None:
    challenge = pick_challenge(header, ref=REF, host="127.0.0.1:5000")
    assert challenge.scheme == scheme
    assert dict(challenge.params) == params


# ------------------------------------------------------------------------- HTTP answers


@pytest.mark.parametrize(
    ("status", "headers", "expected", "retry_after_s"),
    [
        (401, {}, RegistryAuthFailed, None),
        (403, {}, RegistryAuthFailed, None),
        (404, {}, ImageNotFound, None),
        (429, {"retry-after": "7"}, RegistryUnavailable, 7.0),
        (500, {}, RegistryError, 5.0),  # the class default
        (503, {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, RegistryError, 90.0),
        (503, {"retry-after": "soon"}, RegistryError, 5.0),
        (502, {"retry-after": "-3"}, RegistryError, 5.0),  # not a delay: the default
        (400, {}, RegistryUnavailable, 5.0),
    ],
)
def test_status_error(
    status: int,
    headers: dict[str, str],
    expected: type[NodeAgentError],
    retry_after_s: float | None,
) -> None:
    error = status_error(status, headers, ref=REF, what="manifest", now_s=NOW_S)
    assert type(error) is expected
    assert REF in str(error)
    assert f"HTTP {status}" in str(error)
    if isinstance(error, RegistryUnavailable):
        assert error.retry_after_s == retry_after_s


def test_status_ok_is_no_error() -> None:
    assert status_error(200, {}, ref=REF, what="manifest", now_s=NOW_S) is None


@pytest.mark.parametrize(
    ("credentials", "expected"),
    [
        (RegistryCredentials("r", username="alice", password="p:w"), "Basic YWxpY2U6cDp3"),
        (RegistryCredentials("r", auth="YWxpY2U6cHc="), "Basic YWxpY2U6cHc="),
        (RegistryCredentials("r", username="a", password="b", auth="ignored"), "Basic YTpi"),
        (RegistryCredentials("r", registry_token="tok"), None),
        (RegistryCredentials("r"), None),
    ],
)
def test_basic_authorization(credentials: RegistryCredentials, expected: str | None) -> None:
    assert basic_authorization(credentials) == expected

"""``nodeos``: recorded outputs of bootc, rpm-ostree and os-release (fixtures/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.nodeos import (
    MAX_TOOL_OUTPUT_BYTES,
    BootedImage,
    booted_from_bootc,
    booted_from_rpm_ostree,
    os_image,
    parse_os_release,
)
from nodeagent.strict import MalformedInput

FIXTURES = Path(__file__).parent / "fixtures"
OCP = "quay.io/openshift-release-dev/ocp-v4.0-art-dev"
BOOTC_DIGEST = "sha256:3f1c0a3d0e1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5"
RPM_OSTREE_DIGEST = "sha256:1b2c3d4e5f60718293a4b5c6d7e8f9012a3b4c5d6e7f8091a2b3c4d5e6f7a8b9"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_bootc_reports_the_booted_image_its_digest_and_version() -> None:
    assert booted_from_bootc(fixture("bootc-status-booted.json")) == BootedImage(
        "bootc", f"{OCP}@{BOOTC_DIGEST}", BOOTC_DIGEST, "9.6.20251015-0"
    )


def test_bootc_on_a_host_that_booted_no_image_says_nothing() -> None:
    assert booted_from_bootc(fixture("bootc-status-not-booted.json")) is None


def test_rpm_ostree_reports_the_booted_deployment_not_the_staged_one() -> None:
    assert booted_from_rpm_ostree(fixture("rpm-ostree-status-container.json")) == BootedImage(
        "rpm-ostree", f"{OCP}@{RPM_OSTREE_DIGEST}", RPM_OSTREE_DIGEST, "418.94.202509240704-0"
    )


def test_rpm_ostree_on_a_classic_ostree_host_has_no_image() -> None:
    assert booted_from_rpm_ostree(fixture("rpm-ostree-status-ostree.json")) is None


def test_os_release_as_rhcos_writes_it() -> None:
    found = parse_os_release(fixture("os-release-rhcos").decode())
    assert found == {
        "ID": "rhcos",
        "VERSION_ID": "4.18",
        "VERSION": "418.94.202509240704-0",
        "PRETTY_NAME": "Red Hat Enterprise Linux CoreOS 418.94.202509240704-0",
    }


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("ID=fedora", "fedora"),
        ("ID='fedora'", "fedora"),
        ('ID="a \\"quoted\\" word"', 'a "quoted" word'),
        ("  ID=spaced  ", "spaced"),
        ("ID=" + "x" * 300, None),  # clipped, never longer than the CRD's 256
        ("ID=\x1b[31mred", "\\x1b[31mred"),
    ],
)
def test_os_release_values_are_unquoted_and_bounded(line: str, expected: str | None) -> None:
    value = parse_os_release(line)["ID"]
    assert len(value) <= 256
    if expected is not None:
        assert value == expected


def test_the_status_prefers_bootc_and_keeps_only_what_is_known() -> None:
    bootc = booted_from_bootc(fixture("bootc-status-booted.json"))
    rpm = booted_from_rpm_ostree(fixture("rpm-ostree-status-container.json"))
    image = os_image(fixture("os-release-rhcos").decode(), bootc=bootc, rpm_ostree=rpm)
    assert image.to_json() == {
        "id": "rhcos",
        "versionId": "4.18",
        "version": "418.94.202509240704-0",
        "prettyName": "Red Hat Enterprise Linux CoreOS 418.94.202509240704-0",
        "booted": {
            "source": "bootc",
            "image": f"{OCP}@{BOOTC_DIGEST}",
            "digest": BOOTC_DIGEST,
            "version": "9.6.20251015-0",
        },
    }
    assert os_image(None, bootc=None, rpm_ostree=None).to_json() == {}


@pytest.mark.parametrize(
    ("reference", "image"),
    [
        ("ostree-unverified-registry:quay.io/a/b:4", "quay.io/a/b:4"),
        ("ostree-image-signed:docker://quay.io/a/b:4", "quay.io/a/b:4"),
        ("ostree-unverified-image:registry:quay.io/a/b:4", "quay.io/a/b:4"),
        ("ostree-remote-registry:fedora:quay.io/a/b:4", "quay.io/a/b:4"),
        ("ostree-remote-image:fedora:docker://quay.io/a/b:4", "quay.io/a/b:4"),
        ("ostree-unverified-image:oci:/var/lib/img", "oci:/var/lib/img"),
    ],
)
def test_rpm_ostree_references_lose_their_transport(reference: str, image: str) -> None:
    doc = {"deployments": [{"booted": True, "container-image-reference": reference}]}
    found = booted_from_rpm_ostree(json.dumps(doc).encode())
    assert found == BootedImage("rpm-ostree", image, None, None)


def bootc_with(image: Any) -> bytes:
    return json.dumps({"status": {"booted": {"image": image}}}).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "not a JSON object"),
        (b'{"status": {"booted": {"image": 1}}}', "is not an object"),
        (bootc_with({"image": {"image": 5}}), "is not a string"),
        (bootc_with({"image": {"image": "q.io/a"}, "imageDigest": "md5:00"}), "not a sha256"),
        (b'{"a": 1, "a": 2}', "duplicate"),
        (b'{"x": NaN}', "NaN"),
        (b" " * (MAX_TOOL_OUTPUT_BYTES + 1), str(MAX_TOOL_OUTPUT_BYTES)),
    ],
)
def test_bootc_output_that_is_not_its_shape_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(MalformedInput, match=message):
        booted_from_bootc(data)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"deployments": {}}, "no deployments list"),
        ({"deployments": [{"booted": True}, {"booted": True}]}, "more than one booted"),
        (
            {
                "deployments": [
                    {
                        "booted": True,
                        "container-image-reference": "x",
                        "container-image-reference-digest": "sha256:AB",
                    }
                ]
            },
            "not a sha256",
        ),
    ],
)
def test_rpm_ostree_output_that_is_not_its_shape_is_refused(
    doc: dict[str, Any], message: str
) -> None:
    with pytest.raises(MalformedInput, match=message):
        booted_from_rpm_ostree(json.dumps(doc).encode())

"""Release bundles, pure: the release image's files, ``bundle.json``'s ``release`` (rules R31
and R32 of docs/bundle-format.md), the signature ConfigMap and the next steps."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
import yaml

from nodeagent.bundles import manifest as bundle
from nodeagent.bundles import release
from nodeagent.errors import BundleReleaseInvalid, ReleaseImageInvalid
from nodeagent.references import parse_pinned_image_ref

HEX_A, HEX_B, HEX_C, HEX_D = "a" * 64, "b" * 64, "c" * 64, "d" * 64
RELEASE = f"quay.io/openshift-release-dev/ocp-release@sha256:{HEX_A}"
PAYLOAD = f"quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{HEX_B}"
SIG_PATH = f"release-signatures/sha256-{HEX_A}-1"


def image_stream(tags: list[Any]) -> bytes:
    return json.dumps({"kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
                       "spec": {"tags": tags}}).encode()  # fmt: skip


def tag(name: str, ref: str) -> dict[str, Any]:
    return {"name": name, "from": {"kind": "DockerImage", "name": ref}}


# ---------------------------------------------------------------- the release image
def test_image_references_lists_each_payload_image_by_component() -> None:
    found = release.parse_image_references(
        image_stream([tag("cli", PAYLOAD), tag("installer", RELEASE.replace("ocp-release", "x"))])
    )
    assert [(p.name, str(p.ref)) for p in found] == [
        ("cli", PAYLOAD),
        ("installer", RELEASE.replace("ocp-release", "x")),
    ]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        pytest.param(b'{"kind": "ImageStream", "kind": "x"}', "duplicate", id="duplicate-key"),
        pytest.param(b"[]", "not an ImageStream", id="not-an-object"),
        pytest.param(image_stream([]), "1 to 500", id="no-tags"),
        pytest.param(image_stream([tag("cli", PAYLOAD)] * 2), "twice", id="twice"),
        pytest.param(image_stream([tag("cli", "quay.io/x:latest")]), "cli", id="by-tag"),
        pytest.param(image_stream([tag("../x", PAYLOAD)]), "name", id="bad-name"),
        pytest.param(
            image_stream([{"name": "cli", "from": {"kind": "ImageStreamTag", "name": PAYLOAD}}]),
            "DockerImage",
            id="kind",
        ),
        pytest.param(image_stream([tag(f"c{n}", PAYLOAD) for n in range(501)]), "500", id="many"),
        pytest.param(b"[" * 100 + b"]" * 100, "deep", id="deep"),
    ],
)
def test_bad_image_references_are_refused(data: bytes, needle: str) -> None:
    with pytest.raises(ReleaseImageInvalid) as caught:
        release.parse_image_references(data)
    assert needle in caught.value.message
    assert len(caught.value.message) < 600


def test_release_metadata_gives_the_version() -> None:
    data = json.dumps({"kind": "cincinnati-metadata-v0", "version": "4.16.3"}).encode()
    assert release.parse_release_metadata(data) == "4.16.3"
    for bad in (b'{"version": 4.16}', b'{"version": "4.16\\n3"}', b'{"version": NaN}', b"{}"):
        with pytest.raises(ReleaseImageInvalid):
            release.parse_release_metadata(bad)


def test_a_missing_release_file_is_named() -> None:
    with pytest.raises(ReleaseImageInvalid) as caught:
        release.parse_release_files({release.IMAGE_REFERENCES_PATH: image_stream([])})
    assert release.RELEASE_METADATA_PATH in caught.value.message


@pytest.mark.parametrize(
    ("version", "name"),
    [("4.16.3", "release-4.16.3"), ("4.17.0-rc.1", "release-4.17.0-rc.1"),
     ("4.16.3+AMD64", "release-4.16.3-amd64"), ("4.16.3_x-", "release-4.16.3-x")],
)  # fmt: skip
def test_release_set_names_are_set_names(version: str, name: str) -> None:
    assert release.release_set_name(version) == name


def test_the_release_set_holds_the_release_image_first_and_each_image_once() -> None:
    payload = release.ReleasePayload(
        "4.16.3",
        (
            release.PayloadImage("a", parse_pinned_image_ref(PAYLOAD)),
            release.PayloadImage("b", parse_pinned_image_ref(PAYLOAD)),
        ),
    )
    found = release.release_set(
        payload, parse_pinned_image_ref(RELEASE), "release-4.16.3", is_persistent=True
    )
    assert [str(ref) for ref in found.images] == [RELEASE, PAYLOAD]


@pytest.mark.parametrize(
    ("dir_name", "file_name", "index"),
    [(f"sha256={HEX_A}", "signature-1", 1), (f"sha256={HEX_A}", "signature-12", 12),
     (f"sha256={HEX_B}", "signature-1", None), (f"sha256={HEX_A}", "signature-0", None),
     (f"sha256={HEX_A}", "signature-01", None), (f"sha256-{HEX_A}", "signature-1", None),
     (f"sha256={HEX_A}", "signature-1.tmp", None)],
)  # fmt: skip
def test_the_signature_store_layout(dir_name: str, file_name: str, index: int | None) -> None:
    assert release.store_signature_index(dir_name, file_name, f"sha256:{HEX_A}") == index


def test_layer_member_names_are_paths_in_the_image() -> None:
    names = ["./release-manifests/image-references", "/release-manifests/release-metadata"]
    assert [release.layer_member_name(n) for n in names] == list(release.RELEASE_FILES)
    assert release.layer_member_name("../release-manifests/image-references") not in (
        release.RELEASE_FILES
    )


# ---------------------------------------------------------------- bundle.json's release
def release_manifest(**release_changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "image": RELEASE, "version": "4.16.3", "set": "release-4.16.3",
        "signatures": [{"digest": f"sha256:{HEX_A}", "index": 1, "path": SIG_PATH,
                        "sizeBytes": 600, "sha256": HEX_D}],
    }  # fmt: skip
    value.update(release_changes)
    return {
        "formatVersion": 3, "sequence": 1, "bundleId": "release-4.16.3",
        "created": "2026-11-22T09:30:00Z",
        "architecture": "amd64", "layout": "oci",
        "images": [{"name": RELEASE, "manifestDigest": f"sha256:{HEX_A}", "sizeBytes": 300}],
        "blobs": [{"digest": f"sha256:{HEX_A}", "sizeBytes": 300}],
        "files": [{"path": "oci-layout", "sha256": HEX_C, "sizeBytes": 30},
                  {"path": "index.json", "sha256": HEX_C, "sizeBytes": 40},
                  {"path": SIG_PATH, "sha256": HEX_D, "sizeBytes": 600}],
        "pinnedImageSets": [{"persistent": True, "object": {
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
            "metadata": {"name": "release-4.16.3"},
            "spec": {"pinnedImages": [{"name": RELEASE}]}}}],
        "release": value,
    }  # fmt: skip


def parse(doc: dict[str, Any]) -> bundle.BundleManifest:
    return bundle.parse_manifest(json.dumps(doc).encode())


def test_a_release_bundle_is_parsed() -> None:
    found = parse(release_manifest()).release
    assert found is not None
    assert (str(found.image), found.version, found.set_name) == (
        RELEASE,
        "4.16.3",
        "release-4.16.3",
    )
    assert found.signatures == (
        release.ReleaseSignature(f"sha256:{HEX_A}", 1, SIG_PATH, 600, HEX_D),
    )
    assert found.signatures[0].key == f"sha256-{HEX_A}-1"
    without = release_manifest()
    del without["release"]
    assert parse(without).release is None


def test_a_release_bundle_carries_the_versions_it_upgrades_from() -> None:
    found = parse(release_manifest(previous=["4.16.1", "4.16.2", "4.16.1"])).release
    assert found is not None and found.previous == ("4.16.1", "4.16.2")
    assert release.release_doc(found)["previous"] == ["4.16.1", "4.16.2"]
    older = parse(release_manifest()).release  # a bundle made before previous was carried
    assert older is not None and older.previous == ()
    assert "previous" not in release.release_doc(older)


@pytest.mark.parametrize(
    ("metadata", "previous"),
    [
        ({"version": "4.16.3", "previous": ["4.16.2", "4.15.20"]}, ("4.16.2", "4.15.20")),
        ({"version": "4.16.3"}, ()),  # none listed: it upgrades from nothing
        ({"version": "4.16.3", "previous": []}, ()),
    ],
)
def test_release_metadata_gives_the_versions_it_upgrades_from(
    metadata: dict[str, Any], previous: tuple[str, ...]
) -> None:
    assert release.parse_release_previous(json.dumps(metadata).encode()) == previous


@pytest.mark.parametrize(
    "metadata",
    [
        {"version": "4.16.3", "previous": "4.16.2"},
        {"version": "4.16.3", "previous": [None]},
        {"version": "4.16.3", "previous": ["4.16.2\n"]},
        {"version": "4.16.3", "previous": ["4.16.2"] * 1001},
    ],
)
def test_a_bad_previous_is_a_reason_code(metadata: dict[str, Any]) -> None:
    with pytest.raises(ReleaseImageInvalid) as caught:
        release.parse_release_previous(json.dumps(metadata).encode())
    assert caught.value.message.isprintable()


def _with(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out.update(changes)
    return out


def _signature(**changes: Any) -> list[dict[str, Any]]:
    item = release_manifest()["release"]["signatures"][0] | changes
    return [item]


def _without(doc: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != key}


def _of_another_digest() -> dict[str, Any]:
    """A signature of the payload image's digest, listed in files[] like any other: the
    ConfigMap is named after the release digest and may only hold its keys (decision 0051)."""
    path = f"release-signatures/sha256-{HEX_B}-1"
    doc = release_manifest(signatures=_signature(digest=f"sha256:{HEX_B}", path=path))
    doc["files"].append({"path": path, "sha256": HEX_D, "sizeBytes": 600})
    return doc


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        pytest.param(_without(_with(release_manifest(), formatVersion=2), "sequence"),
                     "formatVersion 3",
                     id="R31-format-2"),
        pytest.param(release_manifest(extra=1), "holding only", id="R31-unknown-key"),
        pytest.param(_with(release_manifest(), release=[]), "holding only", id="R31-not-object"),
        pytest.param(release_manifest(image=PAYLOAD), "not one of the bundle's images",
                     id="R31-image-not-carried"),
        pytest.param(release_manifest(image="quay.io/x:4.16"), "image", id="R31-image-by-tag"),
        pytest.param(release_manifest(version="4.16\u202e3"), "version", id="R31-version"),
        pytest.param(release_manifest(set="release-4.16.4"), "not one of the bundle's",
                     id="R31-set-not-carried"),
        pytest.param(release_manifest(set="Release/x"), "set", id="R31-set-name"),
        pytest.param(release_manifest(signatures={}), "list", id="R31-signatures-not-list"),
        pytest.param(release_manifest(signatures=_signature() * 2), "twice",
                     id="R31-signature-twice"),
        pytest.param(release_manifest(signatures=_signature(index=0)), "index",
                     id="R31-index-zero"),
        pytest.param(release_manifest(signatures=_signature(index=True)), "index",
                     id="R31-index-bool"),
        pytest.param(release_manifest(signatures=_signature(digest="sha256:x")), "digest",
                     id="R31-digest"),
        pytest.param(_of_another_digest(), "is not of the release image", id="R31-other-digest"),
        pytest.param(release_manifest(signatures=_signature(extra=1)), "exactly",
                     id="R31-signature-key"),
        pytest.param(release_manifest(signatures=_signature(path="../../etc/passwd")),
                     "path must be", id="R32-path-escape"),
        pytest.param(release_manifest(signatures=_signature(index=2,
                     path=f"release-signatures/sha256-{HEX_A}-2")), "not listed",
                     id="R32-not-listed"),
        pytest.param(release_manifest(signatures=_signature(sizeBytes=601)), "not listed",
                     id="R32-size-differs"),
        pytest.param(release_manifest(signatures=_signature(sha256=HEX_C)), "not listed",
                     id="R32-sha256-differs"),
        pytest.param(release_manifest(signatures=_signature() * 17), "at most 16",
                     id="R31-too-many"),
        pytest.param(release_manifest(previous="4.16.2"), "previous must be a list",
                     id="R31-previous-not-list"),
        pytest.param(release_manifest(previous=["4.16.2", 4]), "not a release version",
                     id="R31-previous-not-text"),
        pytest.param(release_manifest(previous=["4.16\u202e2"]), "not a release version",
                     id="R31-previous-control"),
        pytest.param(release_manifest(previous=["4.16.2"] * 1001), "at most 1000",
                     id="R31-previous-too-many"),
    ],
)  # fmt: skip
def test_a_bad_release_object_is_refused(doc: dict[str, Any], needle: str) -> None:
    with pytest.raises(BundleReleaseInvalid) as caught:
        parse(doc)
    assert needle in caught.value.message, caught.value.message
    assert "\u202e" not in caught.value.message


def test_R32_a_signature_file_over_the_bound_is_refused_even_when_listed() -> None:
    doc = release_manifest(signatures=_signature(sizeBytes=release.MAX_SIGNATURE_BYTES + 1))
    doc["files"][2]["sizeBytes"] = release.MAX_SIGNATURE_BYTES + 1
    with pytest.raises(BundleReleaseInvalid, match="at most"):
        parse(doc)


def test_a_target_is_allowed_in_a_format_3_bundle() -> None:
    doc = release_manifest()
    doc["target"] = {"nodeSelector": "site=line-3"}
    found = parse(doc)
    assert found.target is not None and found.release is not None


# ---------------------------------------------------------------- on the node
def carried() -> release.BundleRelease:
    found = parse(release_manifest()).release
    assert found is not None
    return found


def test_the_config_map_has_the_shape_the_cvo_reads() -> None:
    signature = b"\x90\x0d signed \x00 bytes"
    config_map = release.signature_config_map(
        carried(), {SIG_PATH: signature}, bundle_id="release-4.16.3"
    )
    assert config_map["metadata"]["namespace"] == "openshift-config-managed"
    assert config_map["metadata"]["labels"] == {"release.openshift.io/verification-signatures": ""}
    assert config_map["metadata"]["name"] == f"sha256-{HEX_A}"
    assert config_map["binaryData"] == {f"sha256-{HEX_A}-1": base64.b64encode(signature).decode()}
    assert yaml.safe_load(release.render_yaml(config_map)) == config_map


def test_the_additions_name_every_key_and_remove_none() -> None:
    config_map = release.signature_config_map(
        carried(), {SIG_PATH: b"signed"}, bundle_id="release-4.16.3"
    )
    patch = release.signature_additions(config_map)
    assert patch == {
        "metadata": {
            "labels": {"release.openshift.io/verification-signatures": ""},
            "annotations": config_map["metadata"]["annotations"],
        },
        "binaryData": {f"sha256-{HEX_A}-1": base64.b64encode(b"signed").decode()},
    }
    assert None not in [*patch["binaryData"].values(), *patch["metadata"]["labels"].values()]


def test_the_next_steps_say_this_node_is_ready_and_name_the_site_view() -> None:
    steps = release.next_steps(carried(), "release-4.16.3")
    assert steps[0] == "release 4.16.3 is pinned on this node (PinnedImageSet release-4.16.3)"
    assert "nodeagent site status --bundle release-4.16.3 --set release-4.16.3" in steps[1]
    assert not any("oc adm upgrade" in step or RELEASE in step for step in steps)

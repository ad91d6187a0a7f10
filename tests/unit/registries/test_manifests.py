"""Unit tests of nodeagent.registries.manifests: strict manifests, indexes and configs.

Crash input of issue 13 kept as a regression case: a manifest body nested ~1000 deep
ended the sync task with a RecursionError.
"""

from __future__ import annotations

import json

import pytest

from nodeagent.errors import ImageNotFound
from nodeagent.registries import (
    MAX_MANIFEST_BYTES,
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
    Descriptor,
    Platform,
    read_image_config_platform,
    read_manifest,
)

D1, D2, D3 = ("sha256:" + c * 64 for c in "123")
REF = f"quay.io/team/app@{D1}"


def _image(**changes: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": D2,
                   "size": 7},
        "layers": [{"mediaType": "l", "digest": D3, "size": 2**53 - 1}],
    }  # fmt: skip
    doc.update(changes)
    return doc


def _body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def test_an_image_manifest() -> None:
    manifest = read_manifest(_body(_image()), ref=REF)
    assert not manifest.is_index
    assert manifest.config == Descriptor("application/vnd.oci.image.config.v1+json", D2, 7)
    assert manifest.layers == (Descriptor("l", D3, 2**53 - 1),)


def test_an_index_with_and_without_platforms() -> None:
    doc = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_INDEX,
        "manifests": [
            {"digest": D2, "size": 5, "platform": {"os": "linux", "architecture": "arm64",
                                                  "variant": "v8", "os.features": ["x"]}},
            {"digest": D3, "size": 6, "annotations": {"a": "b"}},
        ],
    }  # fmt: skip
    manifest = read_manifest(_body(doc), ref=REF)
    assert manifest.is_index
    assert [d.platform for d in manifest.manifests] == [
        Platform("linux", "arm64", "v8"),
        Platform("", ""),
    ]


def _layer(**fields: object) -> dict[str, object]:
    return _image(layers=[{"digest": D3, "size": 1, **fields}])


BAD_MANIFESTS: dict[str, tuple[bytes, str]] = {
    "nested 1000 deep (issue 13)": (
        b'{"schemaVersion":2,"annotations":' + b"[" * 1000 + b"]" * 1000 + b"}",
        "nested 1001 deep, more than 32",
    ),
    "nested 33 deep": (b'{"a":' + b"[" * 32 + b"]" * 32 + b"}", "nested 33 deep"),
    "too large": (b" " * (MAX_MANIFEST_BYTES + 1), "more than the 4194304 allowed"),
    "not JSON": (b"<html>", "not valid JSON"),
    "a list": (b"[]", "not a JSON object"),
    "NaN": (b'{"schemaVersion":NaN}', "NaN is not a JSON number"),
    "duplicate keys": (b'{"layers":[],"layers":[]}', "duplicate key 'layers'"),
    "UTF-16": (_body(_image()).decode().encode("utf-16"), "not UTF-8"),
    "a lone surrogate": (b'{"mediaType":"\\udc00"}', "lone surrogate"),
    "a 4301-digit size (issue 13)": (
        _body(_image()).replace(b'"size": 7', b'"size": ' + b"9" * 4301),
        "an integer of 4301 digits",
    ),
    "schemaVersion 1": (_body(_image(schemaVersion=1)), "only 2 is supported"),
    "schemaVersion true": (_body(_image(schemaVersion=True)), "only 2 is supported"),
    "schemaVersion a string": (_body(_image(schemaVersion="2")), "only 2 is supported"),
    "mediaType a number": (_body(_image(mediaType=5)), "mediaType is a number, not a string"),
    "mediaType unknown": (_body(_image(mediaType="application/x")), "unsupported media type"),
    "mediaType too long": (_body(_image(mediaType="a" * 300)), "300 characters"),
    "no shape": (b'{"schemaVersion":2}', "neither an image manifest nor an index"),
    "layers an object": (_body(_image(layers={})), "layers is an object, not a list"),
    "layers missing": (_body({"mediaType": MEDIA_TYPE_OCI_MANIFEST,
                              "config": {"digest": D2, "size": 1}}),
                       "layers is missing"),
    "config a string": (_body(_image(config="x")), "config is a string, not an object"),
    "config missing": (_body({"mediaType": MEDIA_TYPE_OCI_MANIFEST, "layers": []}),
                       "config is missing"),
    "layer a list": (_body(_image(layers=[[D3, 1]])), r"layers\[0\] is a list"),
    "digest sha512": (_body(_layer(digest="sha512:" + "0" * 128)), r"layers\[0\]\.digest"),
    "digest upper-case": (_body(_layer(digest=D3.upper())), "not sha256:<64 hex>"),
    "digest a path": (_body(_layer(digest="../../etc/passwd")), "not sha256:<64 hex>"),
    "digest missing": (_body(_image(layers=[{"size": 1}])), "not sha256:<64 hex>"),
    "size negative": (_body(_layer(size=-1)), r"layers\[0\]\.size is -1"),
    "size 2^53": (_body(_layer(size=2**53)), "not an integer from 0 to 2\\^53-1"),
    "size a float": (_body(_layer(size=1.0)), "not an integer"),
    "size a string": (_body(_layer(size="1")), "not an integer"),
    "size a boolean": (_body(_layer(size=True)), "not an integer"),
    "layer mediaType a list": (_body(_layer(mediaType=[])), r"layers\[0\]\.mediaType is a list"),
    "index manifests an object": (
        _body({"mediaType": MEDIA_TYPE_OCI_INDEX, "manifests": {}}), "manifests is an object"),
    "index entry a number": (
        _body({"mediaType": MEDIA_TYPE_OCI_INDEX, "manifests": [3]}),
        r"manifests\[0\] is a number"),
    "platform a string": (
        _body({"manifests": [{"digest": D2, "size": 1, "platform": "linux/amd64"}]}),
        r"manifests\[0\]\.platform is a string"),
    "architecture a number": (
        _body({"manifests": [{"digest": D2, "size": 1, "platform": {"architecture": 64}}]}),
        r"manifests\[0\]\.platform\.architecture is a number"),
    "escape sequences in the media type": (
        _body(_image(mediaType="\x1b]0;pwned\x07")), "unsupported media type"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD_MANIFESTS))
def test_a_bad_manifest_is_image_not_found_with_a_clipped_message(name: str) -> None:
    body, message = BAD_MANIFESTS[name]
    with pytest.raises(ImageNotFound, match=message) as caught:
        read_manifest(body, ref=REF)
    shown = str(caught.value)
    assert shown.startswith(f"ImageNotFound: {REF}: the registry's manifest is malformed")
    assert len(shown) < 700
    assert "\x1b" not in shown
    assert "\x07" not in shown


def test_the_content_type_decides_when_the_body_has_no_media_type() -> None:
    doc = _image()
    del doc["mediaType"]
    doc["config"] = {"digest": D2, "size": 1}
    with pytest.raises(ImageNotFound, match="unsupported media type 'text/html'"):
        read_manifest(_body(doc), "text/html; charset=utf-8", ref=REF)
    assert not read_manifest(_body(doc), "", ref=REF).is_index


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"os":"linux","architecture":"amd64","rootfs":{}}', ("linux", "amd64")),
        (b"{}", ("", "")),
    ],
)
def test_image_config_platform(body: bytes, expected: tuple[str, str]) -> None:
    assert read_image_config_platform(body, ref=REF) == expected


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"os":5}',
        b'{"architecture":["amd64"]}',
        b'{"history":' + b"[" * 1000 + b"]" * 1000 + b"}",
        b'{"os":"linux","os":"linux"}',
        b"\xff",
    ],
)
def test_a_bad_image_config_is_image_not_found(body: bytes) -> None:
    with pytest.raises(ImageNotFound, match="its image config is malformed"):
        read_image_config_platform(body, ref=REF)

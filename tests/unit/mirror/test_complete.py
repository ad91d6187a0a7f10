"""What a manifest needs before the node mirror answers it (decision 0061)."""

from __future__ import annotations

import json

from nodeagent.mirror.complete import Parts, manifest_parts
from nodeagent.registries.manifests import Platform

CONFIG, LAYER_1, LAYER_2, AMD64, ARM64 = ("sha256:" + c * 64 for c in "abcde")
IMAGE = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
NODE = Platform("linux", "amd64")


def descriptor(digest: str, architecture: str = "") -> dict[str, object]:
    found: dict[str, object] = {"mediaType": IMAGE, "digest": digest, "size": 1}
    if architecture:
        found["platform"] = {"os": "linux", "architecture": architecture}
    return found


def test_an_image_needs_its_config_then_its_layers() -> None:
    body = json.dumps(
        {"schemaVersion": 2, "mediaType": IMAGE, "config": descriptor(CONFIG),
         "layers": [descriptor(LAYER_1), descriptor(LAYER_2)]}
    ).encode()  # fmt: skip
    assert manifest_parts(body, IMAGE, NODE) == Parts(blobs=(CONFIG, LAYER_1, LAYER_2))


def test_an_index_needs_its_entry_for_the_nodes_platform() -> None:
    entries = [descriptor(ARM64, "arm64"), descriptor(AMD64, "amd64")]
    body = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}).encode()
    assert manifest_parts(body, INDEX, NODE) == Parts(child=AMD64)
    # no entry for this node: answered as it is (which one a client takes is not known)
    assert manifest_parts(body, INDEX, Platform("linux", "s390x")) == Parts()


def test_a_body_it_does_not_take_needs_nothing() -> None:
    assert manifest_parts(b"not json", IMAGE, NODE) == Parts()
    assert manifest_parts(b'{"layers": "no"}', "", NODE) == Parts()

"""Which blobs an image manifest names, and which of them a store lacks (decision 0061)."""

from __future__ import annotations

import json

from nodeagent.mirror.complete import absent_parts, image_parts

CONFIG, LAYER_1, LAYER_2 = ("sha256:" + c * 64 for c in "abc")
IMAGE = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"


def descriptor(digest: str) -> dict[str, object]:
    return {"mediaType": "application/octet-stream", "digest": digest, "size": 1}


def test_an_image_names_its_config_then_its_layers() -> None:
    body = json.dumps(
        {"schemaVersion": 2, "mediaType": IMAGE, "config": descriptor(CONFIG),
         "layers": [descriptor(LAYER_1), descriptor(LAYER_2)]}
    ).encode()  # fmt: skip
    parts = image_parts(body, IMAGE)
    assert parts == (CONFIG, LAYER_1, LAYER_2)
    assert absent_parts(parts, {CONFIG, LAYER_2}) == (LAYER_1,)
    assert absent_parts(parts, {CONFIG, LAYER_1, LAYER_2}) == ()


def test_an_index_or_a_body_it_does_not_take_names_nothing() -> None:
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": []}).encode()
    assert image_parts(index, INDEX) == ()  # which platform a client takes is not known
    assert image_parts(b"not json", IMAGE) == ()
    assert image_parts(b'{"layers": "no"}', "") == ()

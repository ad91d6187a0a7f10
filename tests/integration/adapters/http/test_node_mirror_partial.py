"""The node mirror answers an image manifest only when it can serve every blob it names
(decision 0061, ``nodeagent.mirror.complete``).

containers-image takes every blob of an image from the source that gave its manifest, with
no fallback. A store that holds a manifest but not yet one of its layers (a bundle the site
fetcher is still fetching) must send the client on to the next source instead: 404 for the
manifest, the absent layer reported as missing (it wakes the fetcher), the blobs it does
hold still served one by one; once the layer is stored the manifest is served again. An
index waits for its entry for the node's platform, whole, and for nothing else.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
from pathlib import Path

from nodeagent.adapters.http.admission import Caps
from nodeagent.adapters.http.node_mirror import NodeMirror
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.references import parse_pinned_image_ref
from nodeagent.registries.manifests import Platform
from nodeagent.store import layout
from tests.testenv.images import LayerSpec, TestImage, build_index
from tests.testenv.node_mirror import held_store, node_mirror
from tests.testenv.signed_bundles import Keys, signed_bundle
from tests.testenv.waiting import wait_for_async


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def path_of(ref: str, kind: str, digest: str) -> str:
    repository = parse_pinned_image_ref(ref).repository
    return f"/v2/{repository}/{kind}/{digest}"


async def test_an_image_missing_a_layer_is_not_offered_until_the_layer_is_stored(
    tmp_path: Path,
) -> None:
    held = held_store(tmp_path)
    app, tools = held.bundle_refs  # share their first layer; app's second is its own
    app_digest = parse_pinned_image_ref(app).digest
    manifest = json.loads((held.root / layout.blob_path(app_digest)).read_bytes())
    own_layer = manifest["layers"][1]["digest"]
    stored = held.root / layout.blob_path(own_layer)
    aside = tmp_path / "aside"
    shutil.move(stored, aside)  # as while the fetcher has not stored it yet
    missing: list[str] = []
    async with node_mirror(held, on_missing=missing.append) as mirror:
        status, body = await asyncio.to_thread(
            get, mirror.port, path_of(app, "manifests", app_digest)
        )
        assert status == 404 and b"MANIFEST_UNKNOWN" in body, body
        assert missing == [own_layer]
        tools_digest = parse_pinned_image_ref(tools).digest
        status, _ = await asyncio.to_thread(
            get, mirror.port, path_of(tools, "manifests", tools_digest)
        )
        assert status == 200  # complete: served
        config = manifest["config"]["digest"]
        status, _ = await asyncio.to_thread(get, mirror.port, path_of(app, "blobs", config))
        assert status == 200  # the blobs it holds are still served
        shutil.move(aside, stored)

        async def served() -> bool:
            asked = path_of(app, "manifests", app_digest)
            return (await asyncio.to_thread(get, mirror.port, asked))[0] == 200

        await wait_for_async(served, timeout_s=10, what="the manifest once its layer is stored")


async def test_an_index_waits_for_its_entry_for_the_nodes_platform(tmp_path: Path) -> None:
    keys = Keys.make(tmp_path / "keys")
    amd64 = TestImage("example/multi", [LayerSpec(64 * 1024, 81)]).build(tmp_path / "cache")
    arm64 = TestImage("example/multi", [LayerSpec(48 * 1024, 82)], architecture="arm64")
    multi = build_index([amd64, arm64.build(tmp_path / "cache")])
    bundle = signed_bundle(
        tmp_path / "stick", keys, [multi],  # type: ignore[list-item]  # an index is laid out too
        bundle_id="multi", set_name="multi",
    )  # fmt: skip
    store = tmp_path / "store"
    copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    arm_layer = arm64.build(tmp_path / "cache").layers[0].digest
    amd_layer = amd64.layers[0].digest
    mirror = NodeMirror(
        store, host="127.0.0.1", port=0, verifiers_file=None, caps=Caps(8, 8),
        request_timeout_s=20.0, platform=Platform("linux", "amd64"),
    )  # fmt: skip
    asked = f"/v2/example/multi/manifests/{multi.digest}"
    async with mirror:
        # another platform's layer absent: this node's entry is whole, the index is served
        shutil.move(store / layout.blob_path(arm_layer), tmp_path / "arm-aside")
        assert (await asyncio.to_thread(get, mirror.port, asked))[0] == 200
        # this node's layer absent: the index sends the client on
        shutil.move(store / layout.blob_path(amd_layer), tmp_path / "amd-aside")

        async def refused() -> bool:
            return (await asyncio.to_thread(get, mirror.port, asked))[0] == 404

        await wait_for_async(refused, timeout_s=10, what="the index refused without its layer")

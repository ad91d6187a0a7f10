"""A release bundle's signature files between nodes: the peer server serves only the names
the verified stored manifest lists, the fetcher checks each file's size and sha256 against
``files[]`` before it stores it, and a fetched release bundle gives its signature ConfigMap
as one imported from a stick does.

Real parts: ``PeerServer`` over stores filled by the store's copier, ``PeerClient`` and
``FetchStore`` under the fetcher, mutual TLS on loopback, and a TLS proxy with a valid node
certificate that flips one byte of every release signature it relays (tests in
test_fetcher.py make the same proxy lie about blobs).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.bundles.release import StoredSignatures
from nodeagent.adapters.store.records import read_release_signature
from nodeagent.bundles.release_signatures import SignaturePublisher
from nodeagent.store import layout
from tests.integration.adapters.http.test_fetcher import (
    BUNDLE_ID,
    MIB,
    FlippingProxy,
    Site,
    events,
    fetching_node,
    site_of,
)
from tests.integration.adapters.http.test_peer import fetch
from tests.testenv.signed_bundles import Keys, image, signed_bundle, with_release

pytestmark = pytest.mark.integration

SIGNATURES = [b"first signature " * 40, b"second signature " * 3]


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    keys = Keys.make(tmp_path / "keys")
    cache = tmp_path / "layers"
    release = image("ocp/release", [(MIB // 2, 11)], cache)
    payload = image("ocp/payload", [(MIB // 2, 12)], cache)
    plain = signed_bundle(
        tmp_path / "stick", keys, [release, payload], bundle_id=BUNDLE_ID, set_name="release-4"
    )
    async with site_of(tmp_path, keys, with_release(plain, keys, SIGNATURES)) as found:
        yield found


def listed_paths(site: Site) -> list[str]:
    release = site.bundle.manifest.release
    assert release is not None
    return [s.path for s in release.signatures]


async def test_only_listed_release_signatures_are_served(site: Site) -> None:
    store = site.node_store("node-0")
    address = await site.serve("node-0", store)
    port = int(address.rpartition(":")[2])
    pem = site.tmp / "node-1-client.pem"
    site.ca.client("node-1").write_pair(pem, pem)
    context = ssl.create_default_context(cafile=str(site.ca_file))
    context.load_cert_chain(pem)
    base = f"/nodeagent/v1/bundles/{BUNDLE_ID}"
    first, second = listed_paths(site)
    for path, data in zip((first, second), SIGNATURES, strict=True):
        status, headers, body = await asyncio.to_thread(
            fetch, port, context, "GET", f"{base}/{path}"
        )
        assert (status, body) == (200, data)
        assert headers["content-type"] == "application/octet-stream"

    directory = store / layout.bundle_dir(BUNDLE_ID)
    hex_part = first.rpartition("/")[2].removeprefix("sha256-").rpartition("-")[0]
    unlisted = f"release-signatures/sha256-{hex_part}-7"
    (directory / unlisted).write_bytes(b"on disk, listed nowhere")
    refused = [
        f"{base}/{unlisted}",  # a valid name on disk: not in the manifest, not served
        f"{base}/release-signatures/sha256-{'0' * 64}-1",
        f"{base}/release-signatures/../bundle.json",
        f"{base}/release-signatures/%2e%2e/record.json",
        f"{base}/release-signatures/{first.rpartition('/')[2]}/../../record.json",
        f"{base}/release-signatures/record.json",
        f"{base}/release-signatures/sha256-{hex_part}-01",
        f"/nodeagent/v1/bundles/..%2f{BUNDLE_ID}/{first}",
        f"/nodeagent/v1/bundles/unknown/{first}",
    ]
    for path in refused:
        status, _, body = await asyncio.to_thread(fetch, port, context, "GET", path)
        assert status in (400, 404), path
        assert "errors" in json.loads(body), path

    (directory / second).write_bytes(b"X" + SIGNATURES[1][1:])  # damaged in the store
    status, _, _ = await asyncio.to_thread(fetch, port, context, "GET", f"{base}/{second}")
    assert status == 404
    assert read_release_signature(store, BUNDLE_ID, second) is None
    assert read_release_signature(store, BUNDLE_ID, first) == SIGNATURES[0]


class Applied:
    """The ConfigMap applier (``adapters.kube`` in the daemon), recording what it is given."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def apply_config_map(self, body: dict[str, Any]) -> None:
        self.bodies.append(body)


async def test_a_liar_is_dropped_and_the_fetched_bundle_gives_its_configmap(site: Site) -> None:
    upstream = await site.serve("node-0", site.node_store("node-0"))
    # two proxies in front of one store; one lies about release signatures, the other
    # relays every byte as it is. The fetcher picks among holders at random (decision 0053),
    # so the liar is first the only holder it knows: asked, caught and dropped; then both.
    proxies = [FlippingProxy(site, upstream, marker=b"\0none") for _ in range(2)]
    addresses = [await p.start() for p in proxies]
    proxy = proxies[0]
    proxy.marker = b"/release-signatures/"
    liar, honest = addresses
    now_s = [1000.0]
    node = fetching_node(site, clock=lambda: now_s[0])
    try:
        with capture_logs() as logs:
            await node.look(liar)
            assert node.imported == []  # nothing from the liar alone
            now_s[0] += 3600  # past the bundle's retry and the liar's demotion
            await node.look(liar, honest)
    finally:
        await node.client.close()
        for each in proxies:
            await each.close()
    assert proxy.flipped >= 1
    dropped = events(logs, "bundle_fetch_peer_dropped")
    assert {(d["peer"], d["reason"]) for d in dropped} == {(liar, "PeerAnswerInvalid")}
    assert node.imported == [BUNDLE_ID]
    directory = node.store / layout.bundle_dir(BUNDLE_ID)
    stored = {p: (directory / p).read_bytes() for p in listed_paths(site)}
    assert list(stored.values()) == SIGNATURES
    assert sorted(p.name for p in (directory / "release-signatures").iterdir()) == sorted(
        p.rpartition("/")[2] for p in listed_paths(site)
    )

    # what the daemon's publisher applies after the import (cluster mode), and what
    # ``nodeagent bundle release-signatures ID`` writes: from the fetched store
    applied = Applied()
    source = StoredSignatures(node.store, site.keys.trusted_dir)
    await SignaturePublisher(source, applied).publish(BUNDLE_ID)
    (body,) = applied.bodies
    assert body["metadata"]["namespace"] == "openshift-config-managed"
    digest = site.bundle.manifest.images[0].ref.digest
    keys = {f"{digest.replace(':', '-')}-{n}" for n in (1, 2)}
    assert set(body["binaryData"]) == keys
    decoded = sorted(base64.b64decode(v) for v in body["binaryData"].values())
    assert decoded == sorted(SIGNATURES)


async def test_only_a_liar_nothing_is_stored_then_an_honest_peer_finishes(site: Site) -> None:
    honest = await site.serve("node-0", site.node_store("node-0"))
    proxy = FlippingProxy(site, honest, marker=b"/release-signatures/")
    liar = await proxy.start()
    now = [0.0]
    node = fetching_node(site, clock=lambda: now[0])
    directory = node.store / layout.bundle_dir(BUNDLE_ID)
    try:
        with capture_logs() as logs:
            await node.look(liar)
        assert [d["reason"] for d in events(logs, "bundle_fetch_peer_dropped")] == [
            "PeerAnswerInvalid"
        ]
        assert node.imported == []
        assert not (directory / layout.RECORD_NAME).exists()
        assert not (directory / "release-signatures").exists()
        assert node.reports[-1].reason == "NoPeerLeft"

        now[0] += 3600.0  # past the retry backoff
        await node.look(honest)
    finally:
        await node.client.close()
        await proxy.close()
    assert node.imported == [BUNDLE_ID]
    assert (directory / layout.RECORD_NAME).exists()
    for path, data in zip(listed_paths(site), SIGNATURES, strict=True):
        assert (
            hashlib.sha256((directory / path).read_bytes()).digest()
            == hashlib.sha256(data).digest()
        )

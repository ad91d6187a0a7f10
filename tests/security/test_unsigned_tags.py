"""Attack: make a node's mirror answer a tag nobody signed, or with another digest.

Issue 25, item 3. A mirror that answers a tag decides what a pod by tag runs, and a tag-only
mirror entry puts it before the registry. So a tag is answered only when a verified signed
manifest lists it (``servedTags``, ``bundle create --serve-tags``), for that repository, with
exactly the listed digest. The attacker: any local process asking the loopback mirror
(import time, and the node mirror) or a certificate holder asking the peer server (both
built on the same routing and content code), and a crafted stick. Each request goes to the
real server over its own socket:

- a tag no signed manifest lists (``latest``, a near-miss of the listed one, an upper-case
  sigstore lookalike, 129 characters) is 404; so is the listed tag asked under another
  repository of the same bundle;
- the listed tag is answered with its signed manifest: the body hashes to the digest it
  is listed with, and ``Docker-Content-Digest`` says that digest (the control);
- ``bundle.json`` changed after signing to add a tag is refused by the signature check,
  before any of it is read; a manifest signed by the trusted key that lists a tag with a
  digest of another repository is refused too (``BundleTagsInvalid``, rule R42).
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import ssl
from pathlib import Path

import pytest

from nodeagent.adapters.bundles.tree import verify_bundle
from nodeagent.adapters.http.mirror import BundleServer
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.bundles import minisign
from nodeagent.bundles.mirror import served_blobs
from nodeagent.bundles.tags import answered_tags
from tests.integration.adapters.http import test_peer as peer_tests
from tests.integration.adapters.http.test_peer import MIB, Pki, fetch, peer_server
from tests.testenv.signed_bundles import (
    HOST,
    Keys,
    Signed,
    image,
    signed_bundle,
    with_served_tags,
)

pki = peer_tests.pki
TAG = "v4.16"
Response = tuple[int, dict[str, str], bytes]


@pytest.fixture
def tagged(tmp_path: Path) -> tuple[Signed, Keys]:
    """A signed bundle of two images whose manifest serves one tag of the first."""
    keys = Keys.make(tmp_path / "keys")
    cache = tmp_path / "layers"
    catalog = image("olm/catalog", [(MIB // 4, 1)], cache)
    other = image("olm/other", [(MIB // 4, 2)], cache)
    signed = signed_bundle(
        tmp_path / "stick", keys, [catalog, other], bundle_id="tags-1", set_name="olm",
        sequence=1,
    )  # fmt: skip
    tags = {f"{HOST}/olm/catalog:{TAG}": catalog.digest}
    return with_served_tags(signed, keys, tags), keys


def unsigned_paths() -> list[str]:
    return [
        "/v2/olm/catalog/manifests/latest",
        f"/v2/olm/catalog/manifests/{TAG}.1",
        "/v2/olm/catalog/manifests/V4.16",
        f"/v2/olm/catalog/manifests/sha256-{'A' * 64}.sig",
        f"/v2/olm/catalog/manifests/{'a' * 129}",
        f"/v2/olm/other/manifests/{TAG}",  # listed, but for another repository
        f"/v2/olm/manifests/{TAG}",
        f"/v2/olm/catalog/x/manifests/{TAG}",
        f"/v2/olm/catalog/manifests/..%2f{TAG}",
    ]


def plain(port: int, method: str, path: str) -> Response:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        conn.close()


def check_answers(ask: object, digest: str) -> None:
    assert callable(ask)
    for path in unsigned_paths():
        status, _, _ = ask("GET", path)
        assert status in (400, 404), path
    status, headers, body = ask("GET", f"/v2/olm/catalog/manifests/{TAG}")
    assert status == 200
    assert f"sha256:{hashlib.sha256(body).hexdigest()}" == digest
    assert headers["docker-content-digest"] == digest
    status, headers, body = ask("HEAD", f"/v2/olm/catalog/manifests/{TAG}")
    assert (status, headers["docker-content-digest"], body) == (200, digest, b"")


async def test_the_loopback_mirror_answers_only_signed_tags(tagged: tuple[Signed, Keys]) -> None:
    signed, _ = tagged
    manifest = signed.manifest
    tags = answered_tags(manifest.image_signatures, manifest.served_tags)
    async with BundleServer(signed.root, served_blobs(manifest), tags=tags) as server:
        await asyncio.to_thread(
            check_answers,
            lambda method, path: plain(server.port, method, path),
            signed.images[0].digest,
        )


async def test_the_peer_server_answers_only_signed_tags_from_the_store(
    tagged: tuple[Signed, Keys], pki: Pki, tmp_path: Path
) -> None:
    signed, keys = tagged
    copy_bundle(tmp_path / "store", signed.root, signed.manifest, keys.trusted_dir)
    context: ssl.SSLContext = pki.client_context(pki.ca.client("node-1"))
    async with peer_server(tmp_path, pki) as server:
        await asyncio.to_thread(
            check_answers,
            lambda method, path: fetch(server.port, context, method, path),
            signed.images[0].digest,
        )


def test_a_tag_added_after_signing_fails_the_signature(tagged: tuple[Signed, Keys]) -> None:
    signed, keys = tagged
    doc = json.loads((signed.root / "bundle.json").read_text())
    doc["servedTags"][f"{HOST}/olm/catalog:latest"] = signed.images[0].digest
    (signed.root / "bundle.json").write_text(json.dumps(doc, indent=1))
    report = verify_bundle(signed.root, keys.trusted_dir)
    assert report.error is not None
    assert report.error.reason == "BundleSignatureInvalid"


def test_a_signed_tag_of_another_repositorys_digest_is_refused(
    tagged: tuple[Signed, Keys],
) -> None:
    signed, keys = tagged
    doc = json.loads((signed.root / "bundle.json").read_text())
    doc["servedTags"] = {f"{HOST}/olm/catalog:{TAG}": signed.images[1].digest}
    data = json.dumps(doc, indent=1).encode()
    (signed.root / "bundle.json").write_bytes(data)
    signature = minisign.sign(data, keys.secret, trusted_comment="t")
    (signed.root / "bundle.json.minisig").write_text(signature)
    report = verify_bundle(signed.root, keys.trusted_dir)
    assert report.error is not None
    assert report.error.reason == "BundleTagsInvalid"

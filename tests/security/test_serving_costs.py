"""Attack: a node with a valid certificate makes the peer server work for every request.

Issue 24, finding 5. Two cheap requests cost the server dearly, again and again, on the
shared worker threads:

* ``GET /v2/<any>/manifests/<digest>`` of a stored blob of up to 4 MiB that is not a
  manifest (a layer): the server read it, hashed it and parsed it as JSON at every request,
  since only manifests were remembered;
* ``GET /nodeagent/v1/bundles/<id>/release-signatures/<name>``: the server read and parsed
  the bundle's ``bundle.json`` (up to 16 MiB) at every request to learn which names it lists.

The attack sends ``N`` of each on one keep-alive connection with a valid client certificate
to the real ``PeerServer`` over a real store (mutual TLS, loopback). It shows that the blob
is hashed once and ``bundle.json`` parsed once whatever ``N`` (the verdicts are remembered
per version of the file), that a file replaced meanwhile is checked again, and prints the
process CPU time of the first request and of the others. The loopback mirror serves
manifests with the same code (``adapters.http.content``).
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from nodeagent.adapters.http.content import MAX_MANIFEST_BYTES
from nodeagent.adapters.http.peer import PeerServer
from nodeagent.store import layout
from tests.integration.adapters.http.test_fetcher import BUNDLE_ID, MIB, Site, site_of
from tests.testenv.signed_bundles import Keys, image, signed_bundle, with_release

N = 40
"""Requests of each kind; the figures are per request."""
SIGNATURES = [b"release signature " * 30]


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    keys = Keys.make(tmp_path / "keys")
    cache = tmp_path / "layers"
    release = image("ocp/release", [(4 * MIB - 64 * 1024, 31)], cache)  # a layer just under 4 MiB
    payload = image("ocp/payload", [(MIB // 4, 32)], cache)
    plain = signed_bundle(
        tmp_path / "stick", keys, [release, payload], bundle_id=BUNDLE_ID, set_name="release-4"
    )
    async with site_of(tmp_path, keys, with_release(plain, keys, SIGNATURES)) as found:
        yield found


def timed_gets(port: int, context: ssl.SSLContext, paths: Sequence[str]) -> list[tuple[int, float]]:
    """GET each path on one connection (opened and warmed up first): (status, process CPU s)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        conn.request("GET", "/v2/")
        conn.getresponse().read()
        results = []
        for path in paths:
            started = time.process_time()
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            results.append((response.status, time.process_time() - started))
        return results
    finally:
        conn.close()


def client_context(site: Site) -> ssl.SSLContext:
    pem = site.tmp / "attacker-client.pem"
    site.ca.client("node-9").write_pair(pem, pem)  # a valid certificate of the site
    context = ssl.create_default_context(cafile=str(site.ca_file))
    context.load_cert_chain(pem)
    return context


def figures(what: str, results: list[tuple[int, float]]) -> tuple[float, float]:
    first_s, rest = results[0][1], [cpu for _, cpu in results[1:]]
    mean_s = statistics.mean(rest)
    print(
        f"\n{what}: first request {first_s * 1e3:.2f} ms CPU, the next {len(rest)} "
        f"{mean_s * 1e3:.2f} ms each ({mean_s / first_s:.0%} of the first)"
    )
    return first_s, mean_s


def peer_of(site: Site) -> PeerServer:
    return site.servers[-1]


async def test_a_non_manifest_blob_asked_for_as_a_manifest_is_hashed_once(site: Site) -> None:
    store = site.node_store("node-0")
    address = await site.serve("node-0", store)
    server = peer_of(site)
    blobs = site.bundle.manifest.blobs.items()
    small = [(d, f) for d, f in blobs if f.size_bytes <= MAX_MANIFEST_BYTES]
    digest, file = max(small, key=lambda item: item[1].size_bytes)
    assert file.size_bytes > 3 * MIB  # the layer, not a manifest
    path = f"/v2/ocp/release/manifests/{digest}"
    port = int(address.rpartition(":")[2])
    results = await asyncio.to_thread(timed_gets, port, client_context(site), [path] * N)

    first_s, mean_s = figures(f"manifests/<{file.size_bytes} B layer>", results)
    print(f"bytes hashed for {N} requests: {server.counters.bytes_hashed}")
    assert {status for status, _ in results} == {404}  # not a manifest: MANIFEST_UNKNOWN
    assert server.counters.bytes_hashed == file.size_bytes  # once, not N times
    assert mean_s < first_s

    # The same blob stored again (another inode): its verdict is not trusted, it is hashed again.
    blob = store / layout.blob_path(digest)
    copy = blob.with_name(blob.name + ".copy")
    copy.write_bytes(blob.read_bytes())
    copy.replace(blob)
    again = await asyncio.to_thread(timed_gets, port, client_context(site), [path] * 3)
    assert [status for status, _ in again] == [404] * 3
    assert server.counters.bytes_hashed == 2 * file.size_bytes


async def test_bundle_json_is_parsed_once_for_every_release_signature_request(
    site: Site,
) -> None:
    store = site.node_store("node-0")
    address = await site.serve("node-0", store)
    server = peer_of(site)
    release = site.bundle.manifest.release
    assert release is not None
    path = f"/nodeagent/v1/bundles/{BUNDLE_ID}/{release.signatures[0].path}"
    port = int(address.rpartition(":")[2])
    results = await asyncio.to_thread(timed_gets, port, client_context(site), [path] * N)

    first_s, mean_s = figures("release-signatures/<name>", results)
    assert {status for status, _ in results} == {200}
    assert server.release_files.manifests_parsed == 1  # once, not N times
    assert mean_s < first_s

    # bundle.json rewritten (same bytes, another version of the file): parsed again, once.
    manifest = store / layout.bundle_dir(BUNDLE_ID) / layout.MANIFEST_NAME
    copy = manifest.with_name("bundle.json.copy")
    copy.write_bytes(manifest.read_bytes())
    copy.replace(manifest)
    again = await asyncio.to_thread(timed_gets, port, client_context(site), [path] * 3)
    assert [status for status, _ in again] == [200] * 3
    assert server.release_files.manifests_parsed == 2
